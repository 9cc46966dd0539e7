"""The memory check before the first step: the largest micro-batch goes through once and leaves no trace."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
import torch
from torch import nn

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    Precision,
)
from {{ cookiecutter.package_name }}.loop.longest_batch import (
    try_longest_batch,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)
from {{ cookiecutter.package_name }}.parallel.training_state import (
    TrainingState,
)
from {{ cookiecutter.package_name }}.task.spec import (
    Batch,
    Task,
    TaskData,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
SAMPLES = [[1 + (i * 7) % 9] * (3 + (i * 5) % 11) for i in range(40)]  # 3 to 13 tokens, shuffled


class Toy(nn.Module):
    """Embedding, BatchNorm (a buffer that a forward changes), dropout (draws random numbers), head."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 2)
        self.fail = fail
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(ids.shape))
        if self.fail:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return self.head(self.drop(self.norm(self.embed(ids).mean(dim=1))))


def collate(samples: list[list[int]]) -> Batch:
    ids = torch.zeros(len(samples), max(map(len, samples)), dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample)] = torch.tensor(sample)
    return {"ids": ids}


def unused(*_: Any) -> Any:
    raise AssertionError("the memory check calls nothing but the loss")


TASK = Task(
    build_data=unused,
    build_model=unused,
    loss_sum=lambda model, batch: model(batch["ids"]).sum(),
    evaluation_sums=unused,
    sum_names=(),
    evaluation_metrics=unused,
    save_final=unused,
)


def state_of(model: nn.Module) -> TrainingState:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return TrainingState(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )


def data(lengths: bool = True) -> TaskData:
    return TaskData(
        train=SAMPLES,  # type: ignore[arg-type]  # a list is a map-style dataset
        val=None,
        collate=collate,
        label_names=[],
        train_lengths=[len(sample) for sample in SAMPLES] if lengths else None,
    )


def test_the_largest_micro_batch_runs_once_and_leaves_no_trace() -> None:
    torch.manual_seed(0)
    model = Toy()
    state = state_of(model)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    generators = (torch.get_rng_state(), random.getstate())

    try_longest_batch(state, data(), TASK, 4, ENV, Precision.fp32)

    assert model.shapes == [(4, 13)]  # the 4 longest samples, padded to the longest of all
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before), "weights or buffers changed"
    assert all(parameter.grad is None for parameter in model.parameters())
    assert not state.optimizer.state, "the optimizer stepped"
    assert torch.equal(torch.get_rng_state(), generators[0]) and random.getstate() == generators[1]


def test_the_forward_did_change_what_the_check_restores() -> None:
    """Without the restoring, the same forward and backward would leave traces: the test above can fail."""
    torch.manual_seed(0)
    model = Toy()
    running_mean, generator = model.norm.running_mean.clone(), torch.get_rng_state()
    model(collate(SAMPLES[:4])["ids"]).sum().backward()
    assert not torch.equal(model.norm.running_mean, running_mean)
    assert not torch.equal(torch.get_rng_state(), generator)
    assert model.head.weight.grad is not None


def test_data_without_lengths_is_left_alone() -> None:
    model = Toy()
    try_longest_batch(state_of(model), data(lengths=False), TASK, 4, ENV, Precision.fp32)
    assert model.shapes == []


def test_data_of_one_length_is_left_alone_since_its_first_step_is_that_batch() -> None:
    model = Toy()
    one_length = dataclasses.replace(data(), train_lengths=[5] * len(SAMPLES))
    try_longest_batch(state_of(model), one_length, TASK, 4, ENV, Precision.fp32)
    assert model.shapes == []


def test_a_batch_that_does_not_fit_ends_the_run_in_one_line_naming_the_fix() -> None:
    model = Toy(fail=True)
    with pytest.raises(
        ConfigError, match=r"data.batch_size: 4 samples of 13 tokens .* lower data.batch_size"
    ):
        try_longest_batch(state_of(model), data(), TASK, 4, ENV, Precision.fp32)
