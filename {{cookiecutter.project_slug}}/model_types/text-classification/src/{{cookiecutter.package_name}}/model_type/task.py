"""Text classification: JSON Lines with ``text`` and ``label``, fine-tuning a sequence classifier.

Labels are integers, or strings mapped to ids in sorted order; the names are saved with the model
(``id2label`` / ``label2id`` in its config). Tokenization runs once, on rank 0, and is shared with the
other ranks through a cache file under ``output_dir/cache``; batches are padded to their own longest sample,
and ``data.group_by_length`` puts samples of similar length together, so there is little padding.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from .. import classification
from ..config import Config
from ..data import DataError, cached, chunks, fingerprint, iter_jsonl
from ..distributed import DistEnv
from ..hf import load_classifier, quiet_transformers, save_pretrained
from ..log import log
from ..task_spec import Batch, Task, TaskData, count_real_tokens

FIELDS = ("text", "label")
MAX_UNUSED_LABEL_IDS = 100  # integer labels may skip ids (classes absent from the training file), up to this
CACHE_FORMAT = 2  # of the tokenization cache; part of its key, so an older cache is never read
TOKENIZE_CHUNK = 1024  # lines per tokenizer call: bounded memory on rank 0, whatever the file size


class EncodedDataset(Dataset):
    """Every sample's token ids in one flat int32 tensor: 4 bytes a token, where Python lists take ~36."""

    def __init__(self, tokens: torch.Tensor, lengths: list[int], labels: list[int]) -> None:
        self.tokens = tokens
        self.offsets = [0, *itertools.accumulate(lengths)]
        self.lengths = lengths
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]], self.labels[index]


Labels = list[tuple[Any, int]]  # (label as written, line number) of each record
ARTICLE = {"integer": "an", "string": "a"}  # of each label kind, in messages


def _label_kind(label: Any) -> str | None:
    # bool is an int subclass in Python, but true/false are not class ids.
    return {int: "integer", str: "string"}.get(type(label))


def label_names(labels: Labels, path: str) -> list[str]:
    """Integer labels keep their values as ids; string labels get ids in sorted order."""
    first_kind, first_line = "", 0
    for label, line in labels:
        kind = _label_kind(label)
        if kind is None:
            raise DataError(f"{path}:{line}: label {label!r} must be an integer or a string")
        if not first_kind:
            first_kind, first_line = kind, line
        elif kind != first_kind:
            raise DataError(
                f"{path}: line {line} has {ARTICLE[kind]} {kind} label, line {first_line} "
                f"{ARTICLE[first_kind]} {first_kind} label; use one kind"
            )
        if kind == "integer" and label < 0:
            raise DataError(f"{path}:{line}: label {label} is negative; ids start at 0")
    if first_kind == "integer":
        return [str(index) for index in range(head_size(labels, path))]
    return sorted({label for label, _ in labels})


def head_size(labels: Labels, path: str) -> int:
    """The classes of a head for integer labels: ids 0 to the largest. A typo (1000000 among 0, 1, 2)
    would train a head of a million classes for hours, so mostly-unused ids are refused."""
    largest, line = max(labels)
    used = len({label for label, _ in labels})
    unused = largest + 1 - used
    if unused > max(MAX_UNUSED_LABEL_IDS, 10 * used):
        raise DataError(
            f"{path}:{line}: label {largest} makes a head of {largest + 1} classes, {unused} of them never "
            f"used ({used} distinct labels occur); renumber the labels from 0, or write them as strings"
        )
    return largest + 1


def encode_labels(labels: Labels, names: list[str], kind: str | None, path: str) -> list[int]:
    ids = {name: index for index, name in enumerate(names)}
    encoded = []
    for label, line in labels:
        if _label_kind(label) != kind or str(label) not in ids:
            raise DataError(
                f"{path}:{line}: label {label!r} never appears in data.train_file; "
                "every validation label must be one the model is trained on"
            )
        encoded.append(ids[str(label)])
    return encoded


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


def tokenize_file(path: str, tokenizer: Any, length: int) -> tuple[torch.Tensor, list[int], Labels]:
    """Token ids (flat), lengths and labels of a file, tokenized a chunk of lines at a time."""
    pieces, lengths, labels = [], [], []
    for rows in chunks(iter_jsonl(path, FIELDS), TOKENIZE_CHUNK):
        for row in rows:
            if not isinstance(row["text"], str):
                raise DataError(f"{path}:{row['_line']}: field 'text' must be a string")
        ids = tokenizer([row["text"] for row in rows], truncation=True, max_length=length)["input_ids"]
        pieces.append(torch.tensor(list(itertools.chain.from_iterable(ids)), dtype=torch.int32))
        lengths += [len(sample) for sample in ids]
        labels += [(row["label"], row["_line"]) for row in rows]
    return torch.cat(pieces), lengths, labels


def preprocess(config: Config, tokenizer: Any) -> dict[str, Any]:
    length = max_length(config, tokenizer)
    train_path = config.data.train_file
    tokens, lengths, labels = tokenize_file(train_path, tokenizer, length)
    names = label_names(labels, train_path)
    kind = _label_kind(labels[0][0])
    train = EncodedDataset(tokens, lengths, encode_labels(labels, names, kind, train_path))
    val = None
    if config.data.val_file:
        tokens, lengths, labels = tokenize_file(config.data.val_file, tokenizer, length)
        val = EncodedDataset(tokens, lengths, encode_labels(labels, names, kind, config.data.val_file))
    return {"train": train, "val": val, "labels": names}


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    key = fingerprint(
        CACHE_FORMAT,
        Path(config.data.train_file),
        Path(config.data.val_file) if config.data.val_file else None,
        config.model.pretrained,
        config.data.max_length,
    )
    cache_file = Path(config.output_dir) / "cache" / f"text-classification-{key}.pt"
    tokenizer = load_tokenizer(config)
    processed = cached(cache_file, lambda: preprocess(config, tokenizer), env, [EncodedDataset])
    train, val = processed["train"], processed["val"]
    grouped = config.data.group_by_length
    return TaskData(
        train=train,
        val=val,
        collate=Collator(tokenizer.pad_token_id),
        label_names=processed["labels"],
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
