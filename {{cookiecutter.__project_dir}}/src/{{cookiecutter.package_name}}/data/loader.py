"""Data plumbing shared by every model type: the data error, loaders, and naming a bad JSON Lines line.

Reading data and the preprocessing cache are in data/sources.py and data/cache.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..config import Config
from ..parallel.process_group import DistEnv
from ..task.spec import Batch, TaskData


class DataError(ValueError):
    """Input data the run cannot use; the message names the file and the line or item."""


def make_loader(
    dataset: Dataset, data: TaskData, config: Config, env: DistEnv, **batching: Any
) -> DataLoader:
    """A DataLoader with the project's workers and collate; ``batching`` picks the sampler and batch size.

    Workers persist across epochs (no new processes, no cold first batch each epoch) unless the data
    draws augmentations from their per-epoch seed; pinned memory makes the copy to the GPU asynchronous.
    """
    workers = config.data.num_workers
    return DataLoader(
        dataset,
        collate_fn=data.collate,
        num_workers=workers,
        pin_memory=env.device.type == "cuda",
        persistent_workers=workers > 0 and not data.reseeds_workers,
        multiprocessing_context="fork" if workers and os.name == "posix" else None,
        **batching,
    )


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def iter_jsonl(path: str | Path, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    """JSON Lines records one at a time, naming the file and line of the first bad record (the reader
    of data/sources.py scans a file with it where Arrow's JSON reader refuses it)."""
    found = False
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}:{number}: not UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            missing = [name for name in required if name not in row]
            if missing:
                raise DataError(f"{path}:{number}: missing field {missing[0]!r}")
            row["_line"] = number
            found = True
            yield row
    if not found:
        raise DataError(f"{path}: no records; the file is empty")
