"""Samplers: training shards cover the data with no overlap; evaluation sees every sample exactly once."""

from __future__ import annotations

import pytest
import torch

from {{ cookiecutter.package_name }}.data.sampling import (
    EvalBatches,
    ResumableDistributedSampler,
    length_window,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

CPU = torch.device("cpu")


def _env(rank: int, world_size: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=CPU)


def _shards(size: int, world_size: int, epoch: int = 0, batch: int | None = None) -> list[list[int]]:
    shards = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(
            range(size), _env(rank, world_size), seed=7, global_batch=batch or world_size
        )
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


@pytest.mark.parametrize(
    ("size", "world_size", "batch"), [(100, 2, 2), (101, 2, 8), (101, 3, 12), (10, 4, 4)]
)
def test_training_shards_are_disjoint_and_cover_whole_global_batches(
    size: int, world_size: int, batch: int
) -> None:
    shards = _shards(size, world_size, batch=batch)
    seen = [index for shard in shards for index in shard]
    assert len(seen) == len(set(seen)), "a sample is on two ranks"
    assert len({len(shard) for shard in shards}) == 1, "ranks got different shard sizes"
    assert len(seen) == size - size % batch


def test_the_remainder_sits_out_a_different_set_each_epoch() -> None:
    trained = [{i for shard in _shards(101, 2, epoch, batch=8) for i in shard} for epoch in (0, 1)]
    left_out = [set(range(101)) - samples for samples in trained]
    assert len(left_out[0]) == len(left_out[1]) == 101 % 8
    assert left_out[0] != left_out[1]


def test_a_global_batch_that_the_world_size_does_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of world size 2"):
        ResumableDistributedSampler(range(10), _env(0, 2), seed=7, global_batch=3)


def test_every_epoch_has_its_own_order() -> None:
    assert _shards(64, 2, epoch=0) != _shards(64, 2, epoch=1)


@pytest.mark.parametrize("size", [64, 69])  # 69: neither the world sizes nor the global batch divide it
def test_global_batches_do_not_depend_on_the_world_size(size: int) -> None:
    batch_per_rank = {1: 8, 2: 4, 4: 2}  # the same global batch of 8
    global_batches = {
        world_size: _global_steps(_shards(size, world_size, batch=8), per_rank)
        for world_size, per_rank in batch_per_rank.items()
    }
    assert global_batches[1] == global_batches[2] == global_batches[4]
    assert all(len(batch) == 8 for batch in global_batches[1])


def test_start_at_skips_what_the_job_consumed() -> None:
    full = _shards(40, 2)
    for rank in range(2):
        sampler = ResumableDistributedSampler(range(40), _env(rank, 2), seed=7, global_batch=2)
        sampler.set_epoch(0)
        sampler.start_at(12)  # 12 samples consumed by the whole job: 6 per rank
        assert list(sampler) == full[rank][6:]
        assert len(sampler) == 14


@pytest.mark.parametrize(("size", "world_size"), [(101, 2), (101, 3), (2, 3), (0, 2), (7, 1)])
def test_evaluation_batches_hold_every_sample_once_in_world_size_independent_batches(
    size: int, world_size: int
) -> None:
    dealt = {}
    for rank in range(world_size):
        batches = EvalBatches(size, batch_size=4, env=_env(rank, world_size))
        assert all(batch_id % world_size == rank for batch_id in batches.batch_ids)
        dealt.update(zip(batches.batch_ids, batches, strict=True))
    single = EvalBatches(size, batch_size=4, env=_env(0, 1))
    assert [dealt[j] for j in sorted(dealt)] == list(single)  # the same batches, whatever the world size
    assert sorted(i for batch in dealt.values() for i in batch) == list(range(size))


def _grouped_shards(lengths: list[int], world_size: int, batch: int, epoch: int = 0) -> list[list[int]]:
    shards = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(
            range(len(lengths)), _env(rank, world_size), seed=7, global_batch=batch, lengths=lengths
        )
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def _global_steps(shards: list[list[int]], per_rank: int) -> list[list[int]]:
    steps = -(-len(shards[0]) // per_rank)
    return [
        sorted(i for shard in shards for i in shard[step * per_rank : (step + 1) * per_rank])
        for step in range(steps)
    ]


LENGTHS = [int(8 + 200 * (i * 7919 % 1000) / 1000) for i in range(1000)]  # 8..207, shuffled


@pytest.mark.parametrize("size", [1000, 1001, 995])
def test_grouped_batches_do_not_depend_on_the_world_size(size: int) -> None:
    lengths = (LENGTHS * 2)[:size]
    steps = {
        world_size: _global_steps(_grouped_shards(lengths, world_size, 16), 16 // world_size)
        for world_size in (1, 2, 4)
    }
    assert steps[1] == steps[2] == steps[4]
    assert all(len(step) == 16 for step in steps[1])
    seen = [i for step in steps[2] for i in step]
    assert len(seen) == len(set(seen)) == size - size % 16  # each sample at most once


def test_grouping_cuts_padding_and_keeps_the_order_random() -> None:
    def padded_tokens(shard: list[int]) -> int:
        batches = [shard[i : i + 8] for i in range(0, len(shard), 8)]
        return sum(len(batch) * max(LENGTHS[i] for i in batch) for batch in batches)

    grouped, plain = _grouped_shards(LENGTHS, 2, 16)[0], _shards(1000, 2)[0]
    assert padded_tokens(grouped) < 0.7 * padded_tokens(plain)
    assert _grouped_shards(LENGTHS, 2, 16, epoch=1)[0] != grouped  # a new order every epoch
    means = [sum(LENGTHS[i] for i in grouped[j : j + 8]) / 8 for j in range(0, 64, 8)]
    assert means != sorted(means, reverse=True)  # batches are shuffled, not sorted longest first


def test_no_batch_is_put_first_the_early_lengths_stay_random() -> None:
    """The longest batch is not forced to step 1 (the memory check runs it before training instead):
    the first batch of an epoch is any of its batches."""
    firsts = [max(LENGTHS[i] for i in _grouped_shards(LENGTHS, 1, 16, epoch)[0][:16]) for epoch in range(8)]
    assert len(set(firsts)) > 4
    assert min(firsts) < 0.8 * max(LENGTHS)


def test_a_short_epoch_is_sorted_in_several_windows_not_in_one() -> None:
    assert [length_window(batches) for batches in (1, 3, 12, 120, 200, 10_000)] == [1, 1, 3, 30, 50, 50]
    lengths = LENGTHS[:192]  # 12 global batches of 16: windows of 3
    spans = []
    for epoch in range(4):
        single = _grouped_shards(lengths, 1, 16, epoch)[0]
        batches = [single[i : i + 16] for i in range(0, 192, 16)]
        spans += [max(lengths[i] for i in batch) - min(lengths[i] for i in batch) for batch in batches]
    one_sort = sorted(lengths, reverse=True)
    sorted_spans = [one_sort[i] - one_sort[i + 15] for i in range(0, 192, 16)]
    assert sum(spans) > 2 * sum(sorted_spans)  # more mixed than slices of one global sort


def test_grouped_sampler_resumes_mid_epoch() -> None:
    full = _grouped_shards(LENGTHS, 2, 16)
    for rank in range(2):
        sampler = ResumableDistributedSampler(
            range(1000), _env(rank, 2), seed=7, global_batch=16, lengths=LENGTHS
        )
        sampler.set_epoch(0)
        sampler.start_at(96)
        assert list(sampler) == full[rank][48:]


def test_evaluation_batches_by_length_are_world_size_independent_and_complete() -> None:
    lengths = LENGTHS[:101]
    dealt = {}
    for rank in range(3):
        batches = EvalBatches(101, batch_size=4, env=_env(rank, 3), lengths=lengths)
        dealt.update(zip(batches.batch_ids, batches, strict=True))
    single = list(EvalBatches(101, batch_size=4, env=_env(0, 1), lengths=lengths))
    assert [dealt[j] for j in sorted(dealt)] == single
    assert sorted(i for batch in single for i in batch) == list(range(101))
    spans = [max(lengths[i] for i in batch) - min(lengths[i] for i in batch) for batch in single]
    assert max(spans) < 20  # each batch holds similar lengths
