"""Data plumbing shared by every model type: loaders, JSON Lines reading, the preprocessing cache."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .config import Config
from .distributed import DistEnv, main_process_first
from .task_spec import Batch, TaskData


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
    """JSON Lines records one at a time, naming the file and line of the first bad record."""
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


def read_jsonl(path: str | Path, required: Sequence[str]) -> list[dict[str, Any]]:
    return list(iter_jsonl(path, required))


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Lists of ``size`` items (the last one shorter): tokenize a big file without holding it whole."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def fingerprint(*parts: Any) -> str:
    """A cache key from files (path, size, mtime) and plain values."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path) and part.exists():
            stat = part.stat()
            part = (str(part.resolve()), stat.st_size, stat.st_mtime_ns)
        digest.update(repr(part).encode())
    return digest.hexdigest()[:16]


def cached(cache_file: Path, build: Callable[[], Any], env: DistEnv, safe_types: Sequence[type] = ()) -> Any:
    """Build once on rank 0 and share through a file; the other ranks load it instead of rebuilding.

    Without a shared filesystem (multi-node) a rank that does not see the file builds it itself. The
    file is read with ``weights_only=True``: tensors, plain values and the dataset classes named in
    ``safe_types`` only, so a file planted in ``output_dir`` cannot run code; it is rebuilt instead.
    """
    with main_process_first(env):
        if cache_file.exists():
            try:
                with torch.serialization.safe_globals(list(safe_types)):
                    return torch.load(cache_file, map_location="cpu", weights_only=True)
            except Exception:  # a torn, stale or foreign cache is rebuilt, never trusted
                pass
        value = build()
        if env.is_main:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            partial = cache_file.with_suffix(".partial")
            torch.save(value, partial)
            os.replace(partial, cache_file)
        return value
