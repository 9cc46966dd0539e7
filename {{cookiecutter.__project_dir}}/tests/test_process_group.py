"""Collectives of the shared core in a real 2-process gloo group: ranks agree on the checkpoint they
resume from, and state buffers are made equal before they are evaluated or saved."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.parallel import (
    checkpoint as checkpoint_module,
)
from {{ cookiecutter.package_name }}.parallel.checkpoint import (
    Checkpointer,
    CheckpointError,
)
from {{ cookiecutter.package_name }}.parallel.ddp import (
    parameter_checksums,
    sync_state_buffers,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)
from {{ cookiecutter.package_name }}.parallel.training_state import (
    Progress,
    TrainingState,
)

pytestmark = pytest.mark.slow
WORLD = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def in_group(rank: int, port: int, job, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        results.put(
            (rank, job(DistEnv(rank=rank, local_rank=rank, world_size=WORLD, device=torch.device("cpu"))))
        )
        dist.barrier()  # both ranks are done with the group
    except BaseException:
        dist.destroy_process_group()
        raise
    # Leave without tearing gloo down: its teardown, racing the peer's, now and then ends a process in
    # std::terminate (SIGABRT) after the results are in, which is not what these tests are about.
    os._exit(0)


def run_in_group(job) -> dict[int, object]:
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(in_group, args=(free_port(), job, results), nprocs=WORLD, join=True)
    return dict(results.get() for _ in range(WORLD))


def training_state(model: nn.Module) -> TrainingState:
    optimizer = torch.optim.AdamW(model.parameters())
    return TrainingState(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        progress=Progress(),
    )


class ResumeWhereRank1CannotReadTheNewest:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, env: DistEnv) -> str:
        read = checkpoint_module._read
        if env.rank == 1:  # an NFS hiccup, an out-of-memory read: on one rank only

            def failing(path: Path) -> dict:
                if path.name == "step-00000002.pt":
                    raise OSError("Input/output error")
                return read(path)

            checkpoint_module._read = failing
        try:
            Checkpointer(self.directory, env, keep_last=3).load_latest(
                training_state(nn.Linear(2, 2)), seed=0
            )
        except CheckpointError as error:
            return str(error)
        return "resumed"


def test_ranks_that_read_different_checkpoints_stop_instead_of_diverging(tmp_path: Path) -> None:
    single = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    state = training_state(nn.Linear(2, 2))
    for step in (1, 2):
        state.progress.step = step
        Checkpointer(tmp_path, single, keep_last=3).save(state, config_yaml="seed: 0\n")
    results = run_in_group(ResumeWhereRank1CannotReadTheNewest(tmp_path))
    assert results[0] == results[1]  # the same decision on every rank
    assert "the ranks read different checkpoints" in results[0]
    assert "rank 0 step-00000002.pt, rank 1 step-00000001.pt" in results[0]


class DifferentRunningStatistics:
    def __call__(self, env: DistEnv) -> tuple[list, list, list]:
        torch.manual_seed(0)
        model = nn.BatchNorm1d(3)
        model(torch.randn(8, 3) + env.rank)  # each rank's last batch moves its statistics its own way
        before = parameter_checksums(model)
        sync_state_buffers(model, env.world_size)
        return before, parameter_checksums(model), model.running_mean.tolist()


def test_state_buffers_are_averaged_and_part_of_the_replica_check() -> None:
    results = run_in_group(DifferentRunningStatistics())
    (before_0, after_0, mean_0), (before_1, after_1, mean_1) = results[0], results[1]
    assert before_0 != before_1  # the replica check sees buffers that differ
    assert after_0 == after_1 and mean_0 == mean_1
    torch.manual_seed(0)
    batches = torch.randn(8, 3)
    expected = sum(0.1 * (batches + rank).mean(dim=0) for rank in range(WORLD)) / WORLD
    assert torch.allclose(torch.tensor(mean_0), expected, atol=1e-6)
