"""How the splits of causal-lm data are made, once per filesystem (data/cache.py's ``Recipe``): documents
tokenized and cut into blocks (packing.py), or instruction samples encoded (instructions.py), each a
batched ``map`` in as many processes as there are cores.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets.fingerprint import Hasher
from transformers import AutoConfig

from ..config import Config
from ..data.arrow_rows import IntegerLists
from ..data.cache import arrow_file, map_batches, processes
from ..data.loader import DataError
from ..data.sources import (
    Source,
    SplitReader,
    naming_undecodable,
    require_fields,
    require_text,
    split_sources,
)
from ..observe.log import log
from .instructions import detect_format, samples
from .packing import PACK_BATCH, TOKENS, CutBlocks, Tokenize, block_count

CACHE_FORMAT = 3  # of the packed blocks; part of their key, so an older layout is never read


def block_size(config: Config) -> int:
    """``data.max_length``, capped by the context the model was trained for."""
    model_config = AutoConfig.from_pretrained(config.model.pretrained)
    limits = [
        getattr(model_config, name, None) for name in ("max_position_embeddings", "n_positions", "n_ctx")
    ]
    return min([config.data.max_length, *[limit for limit in limits if isinstance(limit, int)]])


class PackRecipe:
    """How the packed splits are made (data_cache.Recipe): tokenized, then cut, both in parallel."""

    name = "causal-lm"

    def __init__(self, config: Config, tokenizer: Any, reader: SplitReader) -> None:
        data = config.data
        self.train_source, self.val_source = split_sources(data, data.train_file, data.val_file)
        self.tokenizer, self.reader, self.text_field = tokenizer, reader, data.text_field
        self.size, self.processes = block_size(config), data.preprocessing_processes
        self.template = Path(data.chat_template).read_text(encoding="utf-8") if data.chat_template else None

    def key(self) -> str:
        sources = [self.train_source, self.val_source]
        # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
        data = [s and (s.fingerprint() or self.reader.read(s)._fingerprint) for s in sources]
        settings = (CACHE_FORMAT, self.size, self.text_field, self.template)
        return str(Hasher.hash((data, settings, Hasher.hash(self.tokenizer))))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        warnings: list[str] = []
        with naming_undecodable(self.train_source, self.val_source):
            splits = {"train": self.split(self.train_source, folder, "train", warnings)}
            if self.val_source is not None:
                splits["val"] = self.split(self.val_source, folder, "val", warnings)
        return splits, {"block_size": self.size, "warnings": warnings}

    def split(self, source: Source, folder: Path, split: str, warnings: list[str]) -> datasets.Dataset:
        rows = self.reader.read(source)
        kind = detect_format(rows, source, self.text_field)
        if kind != "text":
            encoding = (self.tokenizer, self.size, self.template, self.processes)
            return samples(self.reader, rows, source, kind, encoding, folder, split, warnings)
        require_fields(rows, source, (self.text_field,))
        require_text(rows, source, self.text_field)
        return self.blocks(rows, source, folder, split, keep_partial=split == "val")

    def blocks(
        self, rows: datasets.Dataset, source: Source, folder: Path, split: str, keep_partial: bool
    ) -> datasets.Dataset:
        started, workers = time.monotonic(), processes(len(rows), self.processes)
        tokenize, scratch = Tokenize(self.tokenizer, self.text_field), Path(self.reader.scratch())
        documents = map_batches(
            rows, tokenize, TOKENS, str(scratch / f"documents-{split}.arrow"), f"documents-{split}", workers
        )
        ends = np.cumsum(IntegerLists(documents, "input_ids").lengths(), dtype=np.int64)
        count = block_count(int(ends[-1]), self.size, keep_partial)
        if not count and keep_partial:
            raise DataError(f"{source.name}: fewer than 2 tokens; evaluation needs some text")
        if not count:
            raise DataError(
                f"{source.name}: too little text for one block of {self.size} tokens; "
                "add data or lower data.max_length"
            )
        blocks = map_batches(
            datasets.Dataset.from_dict({"block": np.arange(count)}),
            CutBlocks(documents, ends, self.size),
            TOKENS,
            arrow_file(folder, split),
            f"blocks-{split}",
            workers if count >= workers else 1,
            batch_size=PACK_BATCH,
        )
        seconds = time.monotonic() - started
        log.info(
            f"tokenized and packed {len(rows)} {split} documents into {count} blocks in {seconds:.1f} s "
            f"with {workers} process(es): {len(rows) / max(seconds, 1e-9):.0f} documents/s"
        )
        return blocks
