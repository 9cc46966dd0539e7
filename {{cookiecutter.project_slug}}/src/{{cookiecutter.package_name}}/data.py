"""Data plumbing shared by every model type: samplers, loaders, JSON Lines reading, preprocessing cache."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from .config import Config, ConfigError
from .distributed import DistEnv, main_process_first


class DataError(ValueError):
    """Input data the run cannot use; the message names the file and the line or item."""


@dataclass
class TaskData:
    """What a model type hands to the shared loop."""

    train: Dataset
    val: Dataset | None
    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    # Whatever the model type needs later to build and save its model (label names, tokenizer, ...).
    extras: dict[str, Any] = field(default_factory=dict)


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start part-way into an epoch.

    The shuffle depends on seed and epoch only and ranks take interleaved slices, so the samples of
    global step k are the same whatever the world size. ``drop_last`` keeps every rank's share equal.
    """

    def __init__(self, dataset: Dataset, env: DistEnv, seed: int) -> None:
        super().__init__(
            dataset,
            num_replicas=env.world_size,
            rank=env.rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
        )
        self.skip = 0

    def start_at(self, global_samples_done: int) -> None:
        """Skip what the whole job already consumed of this epoch (set after ``set_epoch``)."""
        self.skip = min(global_samples_done // self.num_replicas, self.num_samples)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.skip :])

    def __len__(self) -> int:
        return self.num_samples - self.skip


class EvalBatches(Sampler[list[int]]):
    """Evaluation batches fixed globally and dealt round-robin: batch j holds samples [jB, (j+1)B) and
    goes to rank j % world size.

    Every validation sample is evaluated exactly once (no padding duplicates), and always in the same
    batch whatever the world size, so per-batch sums are bitwise the same for 1, 2 or 64 processes.
    """

    def __init__(self, size: int, batch_size: int, env: DistEnv) -> None:
        self.total_batches = math.ceil(size / batch_size)
        self.batch_ids = list(range(env.rank, self.total_batches, env.world_size))
        self.batches = [list(range(j * batch_size, min((j + 1) * batch_size, size))) for j in self.batch_ids]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def make_loader(
    dataset: Dataset, data: TaskData, config: Config, env: DistEnv, **batching: Any
) -> DataLoader:
    """A DataLoader with the project's workers and collate; ``batching`` picks the sampler and batch size."""
    workers = config.data.num_workers
    return DataLoader(
        dataset,
        collate_fn=data.collate,
        num_workers=workers,
        pin_memory=env.device.type == "cuda",
        multiprocessing_context="fork" if workers and os.name == "posix" else None,
        **batching,
    )


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def require_file(key: str, value: str) -> None:
    if not value:
        raise ConfigError(f"{key} is empty; give the path of your data")
    if not Path(value).exists():
        raise ConfigError(f"{key}={value!r} does not exist; check the path")


def read_jsonl(path: str | Path, required: Sequence[str]) -> list[dict[str, Any]]:
    """Parse JSON Lines, naming the file and line of the first bad record."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
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
            rows.append(row)
    if not rows:
        raise DataError(f"{path}: no records; the file is empty")
    return rows


def fingerprint(*parts: Any) -> str:
    """A cache key from files (path, size, mtime) and plain values."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path) and part.exists():
            stat = part.stat()
            part = (str(part.resolve()), stat.st_size, stat.st_mtime_ns)
        digest.update(repr(part).encode())
    return digest.hexdigest()[:16]


def cached(cache_file: Path, build: Callable[[], Any], env: DistEnv) -> Any:
    """Build once on rank 0 and share through a file; the other ranks load it instead of rebuilding.

    Without a shared filesystem (multi-node) a rank that does not see the file builds it itself.
    """
    with main_process_first(env):
        if cache_file.exists():
            try:
                return torch.load(cache_file, map_location="cpu", weights_only=False)
            except Exception:  # a torn or stale cache is rebuilt, never trusted
                pass
        value = build()
        if env.is_main:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            partial = cache_file.with_suffix(".partial")
            torch.save(value, partial)
            os.replace(partial, cache_file)
        return value
