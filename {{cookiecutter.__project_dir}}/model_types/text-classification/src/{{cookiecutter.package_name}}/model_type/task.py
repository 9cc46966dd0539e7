"""Text classification: texts with labels, fine-tuning a sequence classifier.

The data is JSON Lines, JSON, CSV or Parquet (``data.train_file``, ``data.val_file``), or the splits of a
hub dataset or local dataset folder (``data.hub_dataset``), read with Hugging Face ``datasets``; the text
and label columns are ``data.text_field`` and ``data.label_field``. Labels are integers, or strings mapped
to ids in sorted order; the names are saved with the model (``id2label`` / ``label2id`` in its config).

Preprocessing runs once per filesystem (see data/cache.py): the data is checked column by column and
tokenized by a batched ``map`` in as many processes as there are cores, into Arrow files under
``output_dir/cache`` that every rank memory-maps. A rerun with the same data, tokenizer and settings reads
them back without tokenizing. Batches are padded to their own longest sample, and ``data.group_by_length``
puts samples of similar length together, so there is little padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from datasets.fingerprint import Hasher
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ..config import Config
from ..data.arrow_rows import IntegerLists, Integers
from ..data.cache import prepare, tokenize_split
from ..data.labels import Classes, read_classes, require_known
from ..data.sources import SplitReader, naming_undecodable, quiet_datasets, read_text_split, split_sources
from ..observe.log import log
from ..parallel.process_group import DistEnv
from ..task import classification
from ..task.hugging_face import load_classifier, quiet_transformers, save_pretrained
from ..task.spec import Batch, Task, TaskData, count_real_tokens

CACHE_FORMAT = 3  # of the tokenized data; part of its key, so an older layout is never read
IDS_ONLY = {"return_attention_mask": False, "return_token_type_ids": False}  # 15% less tokenizer time
FEATURES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "label": datasets.Value("int64")}
)


class EncodedDataset(Dataset):
    """Token ids and label ids of a memory-mapped tokenized split: nothing per sample in this process."""

    def __init__(self, rows: datasets.Dataset) -> None:
        self.tokens = IntegerLists(rows, "input_ids")
        self.labels = Integers(rows, "label")
        self.lengths = torch.from_numpy(self.tokens.lengths())

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor(self.tokens[index]), self.labels[index]


def with_pad_token(tokenizer: Any) -> Any:
    if tokenizer.pad_token is None:  # GPT-2/Llama-style tokenizers have none; reuse the end token
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def load_tokenizer(config: Config) -> Any:
    return with_pad_token(AutoTokenizer.from_pretrained(config.model.pretrained))


def max_length(config: Config, tokenizer: Any) -> int:
    model_limit = tokenizer.model_max_length
    if not isinstance(model_limit, int) or model_limit > 1_000_000:  # "no limit" sentinel
        return config.data.max_length
    return min(config.data.max_length, model_limit)


class Tokenize:
    """The batched ``map`` function: token ids (truncated) and label ids of a batch of records."""

    def __init__(
        self, tokenizer: Any, length: int, text_field: str, label_field: str, classes: Classes
    ) -> None:
        self.tokenizer, self.length = tokenizer, length
        self.text_field, self.label_field, self.classes = text_field, label_field, classes

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        texts = batch[self.text_field]
        ids = self.tokenizer(texts, truncation=True, max_length=self.length, **IDS_ONLY)["input_ids"]
        return {"input_ids": ids, "label": self.classes.ids(batch[self.label_field])}


class TextRecipe:
    """How the tokenized splits are made (data_cache.Recipe): checked, then tokenized in parallel."""

    name = "text-classification"

    def __init__(self, config: Config, tokenizer: Any, reader: SplitReader) -> None:
        data = config.data
        self.train_source, self.val_source = split_sources(data, data.train_file, data.val_file)
        self.tokenizer, self.reader = tokenizer, reader
        self.length = max_length(config, tokenizer)
        self.text_field, self.label_field = data.text_field, data.label_field
        self.processes = data.preprocessing_processes

    def key(self) -> str:
        sources = [self.train_source, self.val_source]
        # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
        data = [s and (s.fingerprint() or self.reader.read(s)._fingerprint) for s in sources]
        settings = (CACHE_FORMAT, self.length, self.text_field, self.label_field)
        return str(Hasher.hash((data, settings, Hasher.hash(self.tokenizer))))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        with naming_undecodable(self.train_source, self.val_source):
            return self.checked_and_tokenized(folder)

    def checked_and_tokenized(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        fields = (self.text_field, self.label_field)
        train = read_text_split(self.reader, self.train_source, *fields)
        classes = read_classes(train, self.train_source, self.label_field)
        splits = {"train": train}
        if self.val_source is not None:
            splits["val"] = read_text_split(self.reader, self.val_source, *fields)
            trained_on = "data.train_file" if self.train_source.path else f"split {self.train_source.split!r}"
            require_known(splits["val"], self.val_source, self.label_field, classes, trained_on)
        tokenize = Tokenize(self.tokenizer, self.length, *fields, classes)
        tokenized = {
            name: tokenize_split(rows, tokenize, FEATURES, folder, name, self.processes, "texts")
            for name, rows in splits.items()
        }
        return tokenized, {"labels": classes.names}


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    quiet_datasets()
    tokenizer = load_tokenizer(config)
    root = Path(config.output_dir) / "cache"
    with SplitReader(root) as reader:
        prepared = prepare(TextRecipe(config, tokenizer, reader), root, env)
    train = EncodedDataset(prepared.splits["train"])
    val = EncodedDataset(prepared.splits["val"]) if "val" in prepared.splits else None
    grouped = config.data.group_by_length
    return TaskData(
        train=train,
        val=val,
        collate=Collator(tokenizer.pad_token_id),
        label_names=prepared.meta["labels"],
        preprocessor=tokenizer,
        count_tokens=count_real_tokens,
        train_lengths=train.lengths if grouped else None,
        val_lengths=val.lengths if grouped and val is not None else None,
    )


class Collator:
    """Pads each batch to its own longest sample (dynamic padding)."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, samples: list[tuple[Sequence[int], int]]) -> Batch:
        longest = max(len(ids) for ids, _ in samples)
        input_ids = torch.full((len(samples), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
        for row, (ids, _) in enumerate(samples):
            input_ids[row, : len(ids)] = torch.as_tensor(ids)
            attention_mask[row, : len(ids)] = 1
        labels = torch.tensor([label for _, label in samples], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def build_model(config: Config, data: TaskData) -> nn.Module:
    names = data.label_names
    model = load_classifier(AutoModelForSequenceClassification, config.model.pretrained, names)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = data.preprocessor.pad_token_id
    log.info(f"loaded {config.model.pretrained} with a classification head for {len(names)} labels")
    return model


def logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def save_final(model: nn.Module, data: TaskData, directory: Path) -> None:
    save_pretrained(model, data.preprocessor, directory)


TASK = Task(
    build_data=build_data,
    build_model=build_model,
    loss_sum=classification.loss_sum(logits),
    evaluation_sums=classification.evaluation_sums(logits),
    sum_names=classification.SUM_NAMES,
    evaluation_metrics=classification.evaluation_metrics,
    save_final=save_final,
)
