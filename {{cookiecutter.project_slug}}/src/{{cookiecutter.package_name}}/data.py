"""Data plumbing shared by every model type: samplers, loaders, JSON Lines reading, preprocessing cache."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from .config import Config
from .distributed import DistEnv, main_process_first


class DataError(ValueError):
    """Input data the run cannot use; the message names the file and the line or item."""


def count_samples(batch: dict[str, torch.Tensor]) -> int:
    return len(next(iter(batch.values())))


def count_real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that are not padding, counted on the host before the batch moves: no device sync."""
    return int(batch["attention_mask"].sum())


@dataclass
class TaskData:
    """What a model type hands to the shared loop."""

    train: Dataset
    val: Dataset | None
    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    # Whatever the model type needs later to build and save its model (label names, tokenizer, ...).
    extras: dict[str, Any] = field(default_factory=dict)
    # The positions a batch puts through the model (tokens, image patches; one per sample by default):
    # tokens_per_s and mfu in metrics.jsonl count these.
    count_tokens: Callable[[dict[str, torch.Tensor]], int] = count_samples
    # Sample lengths, where they vary: data.group_by_length then batches samples of similar length.
    train_lengths: Sequence[int] | None = None
    val_lengths: Sequence[int] | None = None
    # True when __getitem__ draws augmentations from the DataLoader workers' seed, which is new each
    # epoch only if the workers are: such data gets no persistent workers.
    reseeds_workers: bool = False


# data.group_by_length sorts windows of this many global batches by length: long enough that a batch
# rarely mixes short and long samples, short enough that the order stays random at the scale of an epoch.
LENGTH_GROUP_BATCHES = 50


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can start part-way into an epoch and group samples by length.

    The epoch's order depends on seed, epoch and the global batch only, and ranks take interleaved
    slices of it, so the samples of global step k are the same whatever the world size. An epoch is
    whole global batches: the remainder (fewer than ``global_batch`` samples, drawn anew each epoch) sits
    the epoch out, since no cut of it into equal per-rank shares is the same for every world size.
    """

    def __init__(
        self,
        dataset: Dataset,
        env: DistEnv,
        seed: int,
        global_batch: int,
        lengths: Sequence[int] | None = None,
    ) -> None:
        super().__init__(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed)
        if global_batch < 1 or global_batch % env.world_size:
            raise ValueError(f"global batch {global_batch} is not a multiple of world size {env.world_size}")
        self.global_batch = global_batch
        self.total_size = len(self.dataset) // global_batch * global_batch
        self.num_samples = self.total_size // env.world_size
        self.lengths = None if lengths is None else torch.as_tensor(lengths)
        self.skip = 0

    def start_at(self, global_samples_done: int) -> None:
        """Skip what the whole job already consumed of this epoch (set after ``set_epoch``)."""
        self.skip = min(global_samples_done // self.num_replicas, self.num_samples)

    def epoch_order(self) -> torch.Tensor:
        """Every rank's samples of this epoch, in global order (DistributedSampler's shuffle)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=generator)[: self.total_size]
        if self.lengths is not None:
            order = group_by_length(order, self.lengths, self.global_batch, generator)
        return order

    def __iter__(self) -> Iterator[int]:
        mine = self.epoch_order()[self.rank : self.total_size : self.num_replicas]
        return iter(mine[self.skip :].tolist())

    def __len__(self) -> int:
        return self.num_samples - self.skip


def group_by_length(
    order: torch.Tensor, lengths: torch.Tensor, global_batch: int, generator: torch.Generator
) -> torch.Tensor:
    """``order`` (whole global batches) rearranged into global batches of similar-length samples, the
    batches in random order.

    Windows of LENGTH_GROUP_BATCHES global batches are sorted longest first and cut into global batches,
    which are then shuffled. The batch holding the longest sample goes first: a batch that does not fit
    in memory fails at step 1.
    """
    window = global_batch * LENGTH_GROUP_BATCHES
    pieces = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        pieces.append(chunk[torch.argsort(lengths[chunk], descending=True, stable=True)])
    if not pieces:
        return order
    batches = torch.cat(pieces).view(-1, global_batch)
    batches = batches[torch.randperm(len(batches), generator=generator)]
    longest = int(lengths[batches].max(dim=1).values.argmax())
    batches[[0, longest]] = batches[[longest, 0]]
    return batches.flatten()


class EvalBatches(Sampler[list[int]]):
    """Evaluation batches fixed globally and dealt round-robin: batch j holds samples [jB, (j+1)B) of the
    evaluation order and goes to rank j % world size.

    Every validation sample is evaluated exactly once (no padding duplicates), and always in the same
    batch whatever the world size, so per-batch sums are bitwise the same for 1, 2 or 64 processes. With
    ``lengths``, the order is longest first, so each batch holds samples of similar length.
    """

    def __init__(
        self, size: int, batch_size: int, env: DistEnv, lengths: Sequence[int] | None = None
    ) -> None:
        order = list(range(size))
        if lengths is not None:
            order = torch.argsort(torch.as_tensor(lengths), descending=True, stable=True).tolist()
        self.total_batches = math.ceil(size / batch_size)
        self.batch_ids = list(range(env.rank, self.total_batches, env.world_size))
        self.batches = [order[j * batch_size : (j + 1) * batch_size] for j in self.batch_ids]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


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


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def iter_jsonl(path: str | Path, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    """JSON Lines records one at a time, naming the file and line of the first bad record."""
    found = False
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
