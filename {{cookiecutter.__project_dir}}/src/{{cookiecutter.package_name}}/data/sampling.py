"""Which samples each rank trains on and evaluates, in which order: world-size independent and resumable."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from ..parallel.process_group import DistEnv
from ..task.spec import dataset_size

# data.group_by_length sorts windows of this many global batches by length, at most: long enough that a
# batch rarely mixes short and long samples, short enough that the order stays random at the scale of an
# epoch. An epoch has at least LENGTH_GROUP_WINDOWS windows, so a short run's batches are not slices of
# one global sort (the transformers Trainer's group_by_length draws its megabatches the same way).
LENGTH_GROUP_BATCHES = 50
LENGTH_GROUP_WINDOWS = 4
ITERATION_SLICE = 4096  # sample indices turned into Python ints at a time


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
        lengths: Sequence[int] | torch.Tensor | None = None,
    ) -> None:
        super().__init__(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed)
        if global_batch < 1 or global_batch % env.world_size:
            raise ValueError(f"global batch {global_batch} is not a multiple of world size {env.world_size}")
        self.global_batch = global_batch
        self.total_size = dataset_size(self.dataset) // global_batch * global_batch
        self.num_samples = self.total_size // env.world_size
        self.lengths = None if lengths is None else torch.as_tensor(lengths)
        self.skip = 0

    def start_at(self, global_samples_done: int) -> None:
        """Skip what the whole job already consumed of this epoch (set after ``set_epoch``)."""
        self.skip = min(global_samples_done // self.num_replicas, self.num_samples)

    def epoch_order(self) -> torch.Tensor:
        """Every rank's samples of this epoch, in global order (DistributedSampler's shuffle)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(dataset_size(self.dataset), generator=generator)[: self.total_size]
        if self.lengths is not None:
            order = group_by_length(order, self.lengths, self.global_batch, generator)
        return order

    def __iter__(self) -> Iterator[int]:
        return in_slices(self.epoch_order()[self.rank : self.total_size : self.num_replicas][self.skip :])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def in_slices(indices: torch.Tensor) -> Iterator[int]:
    """The indices as Python ints, a slice at a time: the whole epoch as Python ints would hold tens of
    MB per rank at a million samples."""
    for start in range(0, len(indices), ITERATION_SLICE):
        yield from indices[start : start + ITERATION_SLICE].tolist()


def length_window(batches: int) -> int:
    """Global batches per sorted window, for an epoch of ``batches`` global batches."""
    return max(1, min(LENGTH_GROUP_BATCHES, batches // LENGTH_GROUP_WINDOWS))


def group_by_length(
    order: torch.Tensor, lengths: torch.Tensor, global_batch: int, generator: torch.Generator
) -> torch.Tensor:
    """``order`` (whole global batches) rearranged into global batches of similar-length samples, the
    batches in random order.

    Consecutive windows of ``length_window`` global batches of the shuffled order are each sorted by
    length and cut into global batches, which are then shuffled. No batch is put first: which lengths
    come early stays random, as with random batches. A batch too large for memory still fails before
    the first step: the trainer runs the largest one once (loop/longest_batch.py).
    """
    if not len(order):
        return order
    window = global_batch * length_window(len(order) // global_batch)
    pieces = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        pieces.append(chunk[torch.argsort(lengths[chunk], descending=True, stable=True)])
    batches = torch.cat(pieces).view(-1, global_batch)
    return batches[torch.randperm(len(batches), generator=generator)].flatten()


class EvalBatches(Sampler[list[int]]):
    """Evaluation batches fixed globally and dealt round-robin: batch j holds samples [jB, (j+1)B) of the
    evaluation order and goes to rank j % world size.

    Every validation sample is evaluated exactly once (no padding duplicates), and always in the same
    batch whatever the world size, so per-batch sums are bitwise the same for 1, 2 or 64 processes. With
    ``lengths``, the order is longest first, so each batch holds samples of similar length.
    """

    def __init__(
        self, size: int, batch_size: int, env: DistEnv, lengths: Sequence[int] | torch.Tensor | None = None
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
