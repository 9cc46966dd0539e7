"""The DDP arithmetic in float64, under real torchrun; started by tests/test_equivalence.py, never by users.

    torchrun --standalone --nproc-per-node=N tests/float64_probe.py MODE RESULT MUTATION key=value ...

``gradients``: the gradients of the first optimizer step, as the optimizer receives them (all-reduced,
unscaled, unclipped). ``sgd``: the weights after ``train.max_steps`` steps of plain SGD. RESULT is a
safetensors file. In float64 the
runs of different world sizes and accumulation differ only by the order of their sums, so they compare
to a tolerance far below what a scale bug moves. MUTATION (``loss_times_world_size``,
``no_accumulation_weight``, ``micro_batch_means`` or ``none``) injects the bug these proofs exist to
catch.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import sys
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from {{ cookiecutter.package_name }}.config import (
    load_config,
)

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.loop import setup
from {{ cookiecutter.package_name }}.loop.trainer import (
    Trainer,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    TASK,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    barrier,
    distributed,
)
from {{ cookiecutter.package_name }}.task.spec import (
    Task,
    TaskData,
    count_samples,
)


def in_float64(task: Task) -> Task:
    """The model type with its model and its floating inputs in float64."""

    def build_data(config: Any, env: Any) -> TaskData:
        data = task.build_data(config, env)
        collate = data.collate

        def collate_float64(samples: list[Any]) -> dict[str, torch.Tensor]:
            batch = collate(samples)
            return {
                key: value.double() if value.is_floating_point() else value for key, value in batch.items()
            }

        return dataclasses.replace(data, collate=collate_float64)

    return dataclasses.replace(
        task, build_data=build_data, build_model=lambda config, data: task.build_model(config, data).double()
    )


def mutate(task: Task, mutation: str, world_size: int) -> Task:
    if mutation == "loss_times_world_size":  # a sum over the ranks where the mean belongs
        return dataclasses.replace(
            task, loss_sum=lambda model, batch: task.loss_sum(model, batch) * world_size
        )
    if mutation == "micro_batch_means" and task.count_targets is not None:
        # Each micro-batch's mean over its own targets, weighted by its share of the samples: the
        # gradient accumulation bug of micro-batches with different numbers of target tokens.
        count = task.count_targets
        return dataclasses.replace(
            task,
            loss_sum=lambda model, batch: task.loss_sum(model, batch) * count_samples(batch) / count(batch),
            count_targets=None,
        )
    return task


def drop_accumulation_weight(trainer: Trainer) -> None:
    """Divide each micro-batch by its own targets instead of the whole step's: the gradients of a
    step's micro-batches then add up instead of averaging."""
    start_counting_targets = trainer.start_counting_targets
    trainer.start_counting_targets = lambda host_batches: start_counting_targets(host_batches[:1])  # type: ignore[method-assign]


def first_step_gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}
    optimizer = trainer.state.optimizer
    step = optimizer.step

    def capture(*args: Any, **kwargs: Any) -> Any:
        for name, parameter in trainer.state.module.named_parameters():
            if parameter.grad is not None:
                captured[name] = parameter.grad.detach().clone()
        return step(*args, **kwargs)

    optimizer.step = capture  # type: ignore[method-assign]
    trainer.optimizer_step(iter(trainer.plan.train_loader), trainer.plan.samples_per_step)
    return captured


def sgd_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    batches = iter(trainer.plan.train_loader)
    for _ in range(trainer.plan.total_steps):
        trainer.optimizer_step(batches, trainer.plan.samples_per_step)
    return {name: tensor.detach().clone() for name, tensor in trainer.state.module.state_dict().items()}


def plain_sgd(model: nn.Module, config: Any, device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=config.lr)


def main() -> None:
    faulthandler.enable()
    mode, result_file, mutation, *overrides = sys.argv[1:]
    config = load_config(
        [*overrides, "train.max_grad_norm=0", "train.precision=fp32", "train.warmup_ratio=0"]
    )
    if mode == "sgd":
        setup.build_optimizer = plain_sgd  # type: ignore[assignment]
    with distributed(config.distributed) as env:
        task = mutate(in_float64(TASK), mutation, env.world_size)
        trainer = Trainer(config, task, env)
        if mutation == "no_accumulation_weight":
            drop_accumulation_weight(trainer)
        result = first_step_gradients(trainer) if mode == "gradients" else sgd_weights(trainer)
        if env.is_main:
            save_file({name: tensor.contiguous() for name, tensor in result.items()}, result_file)
        barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # see ddp_probe.py: the work is on disk; skip the interpreter's teardown


if __name__ == "__main__":
    main()
