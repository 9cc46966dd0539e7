"""Token classification: sentences of words with one tag each (named entities, say), fine-tuning a token
classifier (``AutoModelForTokenClassification``).

The data is JSON Lines, JSON, CSV or Parquet (``data.train_file``, ``data.val_file``), or the splits of a
hub dataset or local dataset folder (``data.hub_dataset``), read with Hugging Face ``datasets``; the word
and tag columns are ``data.tokens_field`` and ``data.tags_field`` (checked in tagged_data.py). Tags are
strings, mapped to ids in sorted order; the names are saved with the model (``id2label`` / ``label2id``).

Words are split into sub-word tokens by the checkpoint's fast tokenizer (``is_split_into_words``); the
loss and the metrics count each word once, on its first token (alignment.py). Preprocessing runs once per
filesystem (data/cache.py) into Arrow files under ``output_dir/cache`` that every rank memory-maps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc
import torch
from datasets.fingerprint import Hasher
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

from ..config import Config
from ..data.arrow_rows import IntegerLists
from ..data.cache import prepare, tokenize_split
from ..data.loader import DataError
from ..data.sources import SplitReader, naming_undecodable, quiet_datasets, split_sources
from ..observe.log import log
from ..parallel.process_group import DistEnv
from ..task.hugging_face import load_classifier, quiet_transformers, save_pretrained
from ..task.spec import Task, TaskData, count_real_tokens
from . import scoring
from .alignment import UNSEEN, Collator, Tokenize, count_words
from .tagged_data import TaggedSplit

CACHE_FORMAT = 1  # of the tokenized data; part of its key, so an older layout is never read
FEATURES = datasets.Features(
    {name: datasets.List(datasets.Value("int32")) for name in ("input_ids", "word_starts", "word_tags")}
)
# Byte-level BPE tokenizers mark a word's start by the space before it: words given one by one need it.
PREFIX_SPACE_MODELS = {"roberta", "gpt2", "bloom", "deberta", "longformer", "bart"}


class EncodedDataset(Dataset):
    """Token ids, word starts and tag ids of a memory-mapped tokenized split."""

    def __init__(self, rows: datasets.Dataset) -> None:
        self.tokens = IntegerLists(rows, "input_ids")
        self.starts = IntegerLists(rows, "word_starts")
        self.tags = IntegerLists(rows, "word_tags")
        self.lengths = torch.from_numpy(self.tokens.lengths())

    def __len__(self) -> int:
        return len(self.tags)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.tensor(self.tokens[index]),
            torch.tensor(self.starts[index]),
            torch.tensor(self.tags[index]),
        )


def load_tokenizer(pretrained: str | Path) -> Any:
    """The checkpoint's fast tokenizer (only those map tokens back to words), with a pad token."""
    options = {}
    if getattr(AutoConfig.from_pretrained(pretrained), "model_type", None) in PREFIX_SPACE_MODELS:
        options["add_prefix_space"] = True
    tokenizer = AutoTokenizer.from_pretrained(pretrained, **options)
    if not tokenizer.is_fast:
        raise DataError(
            f"model.pretrained={str(pretrained)!r}: its tokenizer is not a fast (Rust) one, which token "
            "classification needs to map tokens to words; choose a checkpoint that ships tokenizer.json"
        )
    if tokenizer.pad_token is None:  # GPT-2/Llama-style tokenizers have none; reuse the end token
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def max_length(config: Config, tokenizer: Any) -> int:
    model_limit = tokenizer.model_max_length
    if not isinstance(model_limit, int) or model_limit > 1_000_000:  # "no limit" sentinel
        return config.data.max_length
    return min(config.data.max_length, model_limit)


class TaggingRecipe:
    """How the tokenized splits are made (data_cache.Recipe): checked, then tokenized in parallel."""

    name = "token-classification"

    def __init__(self, config: Config, tokenizer: Any, reader: SplitReader) -> None:
        data = config.data
        self.train_source, self.val_source = split_sources(data, data.train_file, data.val_file)
        self.tokenizer, self.reader = tokenizer, reader
        self.length = max_length(config, tokenizer)
        self.fields = (data.tokens_field, data.tags_field)
        self.processes = data.preprocessing_processes

    def key(self) -> str:
        sources = [self.train_source, self.val_source]
        # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
        data = [s and (s.fingerprint() or self.reader.read(s)._fingerprint) for s in sources]
        settings = (CACHE_FORMAT, self.length, self.fields)
        return str(Hasher.hash((data, settings, Hasher.hash(self.tokenizer))))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        with naming_undecodable(self.train_source, self.val_source):
            return self.checked_and_tokenized(folder)

    def checked_and_tokenized(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        splits = {"train": TaggedSplit(self.reader, self.train_source, *self.fields)}
        names = splits["train"].tag_names
        if self.val_source is not None:
            splits["val"] = TaggedSplit(self.reader, self.val_source, *self.fields)
            trained_on = "data.train_file" if self.train_source.path else f"split {self.train_source.split!r}"
            splits["val"].require_known(names, trained_on)
        tokenize = Tokenize(self.tokenizer, self.length, {name: index for index, name in enumerate(names)})
        tokenized = {
            name: tokenize_split(
                rows.dataset(), tokenize, FEATURES, folder, name, self.processes, "sentences"
            )
            for name, rows in splits.items()
        }
        return tokenized, {"labels": names}


def unseen_words(rows: datasets.Dataset) -> tuple[int, int]:
    """(words the model does not see, sentences holding them) of a tokenized split."""
    starts = rows.data.column("word_starts")
    unseen = pc.equal(pc.list_flatten(starts), UNSEEN)
    sentences = pc.count_distinct(pc.filter(pc.list_parent_indices(starts), unseen)).as_py()
    return int(pc.sum(unseen).as_py() or 0), int(sentences)


def report_unseen(prepared_val: datasets.Dataset | None, config: Config, env: DistEnv) -> None:
    if prepared_val is None or not env.is_main:
        return
    words, sentences = unseen_words(prepared_val)
    if words:
        log.warning(
            f"{words} validation words in {sentences} sentences lie past data.max_length="
            f"{config.data.max_length} tokens (or make no token): they count as tagged O in the metrics; "
            "raise data.max_length to let the model see them"
        )


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    quiet_datasets()
    tokenizer = load_tokenizer(config.model.pretrained)
    root = Path(config.output_dir) / "cache"
    with SplitReader(root) as reader:
        prepared = prepare(TaggingRecipe(config, tokenizer, reader), root, env)
    report_unseen(prepared.splits.get("val"), config, env)
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


def build_model(config: Config, data: TaskData) -> nn.Module:
    names = data.label_names
    model = load_classifier(AutoModelForTokenClassification, config.model.pretrained, names)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = data.preprocessor.pad_token_id
    log.info(f"loaded {config.model.pretrained} with a token classification head for {len(names)} tags")
    return model


def save_final(model: nn.Module, data: TaskData, directory: Path) -> None:
    save_pretrained(model, data.preprocessor, directory)


TASK = Task(
    build_data=build_data,
    build_model=build_model,
    loss_sum=scoring.loss_sum,
    evaluation_sums=scoring.evaluation_sums,
    sum_names=scoring.SUM_NAMES,
    evaluation_metrics=scoring.evaluation_metrics,
    save_final=save_final,
    count_targets=count_words,
)
