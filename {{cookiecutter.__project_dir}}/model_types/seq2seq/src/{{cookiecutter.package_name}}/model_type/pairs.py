"""The data of sequence to sequence: source and target texts, checked, tokenized and cached once.

The data is JSON Lines, JSON, CSV or Parquet (``data.train_file``, ``data.val_file``), or the splits of a
hub dataset or local dataset folder (``data.hub_dataset``), read with Hugging Face ``datasets``; the two
columns are ``data.source_field`` and ``data.target_field``. Every record needs a non-empty string in
each; the first that has not ends the run at start, naming its file and line (or row) and the fix.

Preprocessing runs once per filesystem (data/cache.py): a batched ``map`` tokenizes the sources (after
``data.source_prefix``, cut to ``data.max_length``) and the targets (cut to ``data.max_target_length``,
always ending with the end-of-text token, so the model learns to stop) into Arrow files that every rank
memory-maps. The validation split also keeps each target's text: BLEU and ROUGE-L score the generated
text against the reference as written, not as the tokenizer would give it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from datasets.fingerprint import Hasher
from torch.utils.data import Dataset

from ..config import Config
from ..data.arrow_rows import ChunkedColumn, IntegerLists
from ..data.cache import tokenize_split
from ..data.loader import DataError
from ..data.sources import (
    Source,
    SplitReader,
    first_row,
    naming_undecodable,
    read_text_split,
    require_text,
    split_sources,
)
from .generation import IDS_ONLY, encode_sources

CACHE_FORMAT = 1  # of the tokenized data; part of its key, so an older layout is never read
IGNORE_INDEX = -100  # label of a position that is no target (padding)
TRAIN_FEATURES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "labels": datasets.List(datasets.Value("int32"))}
)
VAL_FEATURES = datasets.Features({**TRAIN_FEATURES, "reference": datasets.Value("string")})

Pair = tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, str]


def source_length(config: Config, tokenizer: Any) -> int:
    """``data.max_length``, capped by the tokenizer's own limit (when it names one)."""
    model_limit = tokenizer.model_max_length
    if not isinstance(model_limit, int) or model_limit > 1_000_000:  # "no limit" sentinel
        return config.data.max_length
    return min(config.data.max_length, model_limit)


class PairDataset(Dataset):
    """Token ids of sources and targets of a memory-mapped split, and the validation references."""

    def __init__(self, rows: datasets.Dataset) -> None:
        self.sources = IntegerLists(rows, "input_ids")
        self.targets = IntegerLists(rows, "labels")
        self.references = ChunkedColumn(rows, "reference") if "reference" in rows.column_names else None
        # What length grouping sorts by: source and target tokens together.
        self.lengths = torch.from_numpy(self.sources.lengths() + self.targets.lengths())

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> Pair:
        source = torch.from_numpy(self.sources[index].astype(np.int64))
        target = torch.from_numpy(self.targets[index].astype(np.int64))
        if self.references is None:
            return source, target
        chunk, row = self.references.locate(index)
        return source, target, self.references.chunks[chunk][row].as_py()


class Tokenize:
    """The batched ``map`` function: source and target ids (and, for validation, the target's text)."""

    def __init__(self, recipe: PairRecipe, keep_reference: bool) -> None:
        self.recipe, self.keep_reference = recipe, keep_reference

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        recipe = self.recipe
        sources, targets = batch[recipe.source_field], batch[recipe.target_field]
        tokenizer = recipe.tokenizer
        encoded = {
            "input_ids": encode_sources(tokenizer, sources, recipe.prefix, recipe.source_length),
            "labels": [
                ending(ids, tokenizer.eos_token_id, recipe.target_length)
                for ids in tokenizer(
                    text_target=targets, truncation=True, max_length=recipe.target_length, **IDS_ONLY
                )["input_ids"]
            ],
        }
        if self.keep_reference:
            encoded["reference"] = targets
        return encoded


def ending(ids: list[int], eos: int | None, limit: int) -> list[int]:
    """Target ids that end with the end-of-text token (tokenizers that add none get it here)."""
    if eos is None or (ids and ids[-1] == eos):
        return ids
    return [*ids[: limit - 1], eos]


class PairRecipe:
    """How the tokenized splits are made (data/cache.py's Recipe): checked, then tokenized in parallel."""

    name = "seq2seq"

    def __init__(self, config: Config, tokenizer: Any, reader: SplitReader) -> None:
        data = config.data
        self.train_source, self.val_source = split_sources(data, data.train_file, data.val_file)
        self.tokenizer, self.reader = tokenizer, reader
        self.source_field, self.target_field, self.prefix = (
            data.source_field,
            data.target_field,
            data.source_prefix,
        )
        self.source_length = source_length(config, tokenizer)
        self.target_length = data.max_target_length
        self.processes = data.preprocessing_processes

    def key(self) -> str:
        sources = [self.train_source, self.val_source]
        # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
        data = [s and (s.fingerprint() or self.reader.read(s)._fingerprint) for s in sources]
        fields = (self.source_field, self.target_field, self.prefix)
        settings = (CACHE_FORMAT, self.source_length, self.target_length, fields)
        return str(Hasher.hash((data, settings, Hasher.hash(self.tokenizer))))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        with naming_undecodable(self.train_source, self.val_source):
            splits = {"train": self.checked(self.train_source)}
            if self.val_source is not None:
                splits["val"] = self.checked(self.val_source)
            tokenized = {name: self.tokenize(rows, folder, name) for name, rows in splits.items()}
        return tokenized, {}

    def checked(self, source: Source) -> datasets.Dataset:
        """The split, if every record has a non-empty string source and target."""
        rows = read_text_split(self.reader, source, self.source_field, self.target_field)
        require_text(rows, source, self.target_field)
        for field in (self.source_field, self.target_field):
            found = first_row(rows, field, lambda value: not value.strip())
            if found is not None:
                raise DataError(
                    f"{source.where(found[0])}: field {field!r} is empty; give every record a non-empty "
                    f"{field} (or remove the record)"
                )
        return rows

    def tokenize(self, rows: datasets.Dataset, folder: Path, split: str) -> datasets.Dataset:
        validation = split == "val"
        features = VAL_FEATURES if validation else TRAIN_FEATURES
        tokenize = Tokenize(self, keep_reference=validation)
        return tokenize_split(rows, tokenize, features, folder, split, self.processes, "pairs")
