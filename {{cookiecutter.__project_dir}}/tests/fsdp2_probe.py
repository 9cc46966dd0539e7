"""Training runs compared across strategies and world sizes; started by test_fsdp2.py with torchrun.

    torchrun --standalone --nproc-per-node=N tests/fsdp2_probe.py RESULT_DIR RUN=key=value,... ...

Each ``RUN=...`` is one training run (its overrides, comma-separated), all in this one process group: one
start-up for all of them. For each, rank 0 writes ``RESULT_DIR/RUN.pt`` (the trained weights, gathered
whole) and ``RESULT_DIR/RUN.json``: the evaluation of the untrained model, the largest per-rank bytes of
parameters and optimizer state, and the reduce-scatters of two more optimizer steps (one micro-batch,
then ``train.grad_accum_steps``). A run's ``lora.*`` overrides give it LoRA adapters through peft.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.loop.trainer import (
    Trainer,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    TASK,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
    barrier,
    distributed,
    gather_objects,
)


def local_bytes(tensor: torch.Tensor) -> int:
    """What this rank holds of a tensor: its shard for a DTensor, all of it otherwise."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def held_bytes(trainer: Trainer) -> int:
    """Parameters plus optimizer state on this rank, after training."""
    parameters = sum(local_bytes(p) for p in trainer.state.model.parameters())
    optimizer = sum(
        local_bytes(value)
        for state in trainer.state.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )
    return parameters + optimizer


def reduce_scatters(trainer: Trainer) -> list[int]:
    """FSDP2's gradient reductions in an optimizer step of one micro-batch, and in one that accumulates."""
    calls, reduce_scatter = [0], dist.reduce_scatter_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = counting  # FSDP2 calls it through the module, at call time
    try:
        batches, size = iter(trainer.plan.train_loader), trainer.config.data.batch_size
        trainer.optimizer_step(batches, size)
        single = calls[0]
        trainer.optimizer_step(batches, size * trainer.config.train.grad_accum_steps)
        return [single, calls[0] - single]
    finally:
        dist.reduce_scatter_single = reduce_scatter


def train(name: str, overrides: list[str], result_dir: Path, env: DistEnv) -> None:
    trainer = Trainer(load_config(overrides), TASK, env)
    trainer.evaluate()
    untrained = {key: value for key, value in trainer.last_eval.items() if key != "epoch"}
    trainer.fit()
    with trainer.parallel.full_model(trainer.state.model) as module:
        if module is not None and env.is_main:
            torch.save(module.state_dict(), result_dir / f"{name}.pt")
    result = {"untrained": untrained, "bytes": max(gather_objects(held_bytes(trainer), env))}
    result["reduce_scatters"] = reduce_scatters(trainer)
    if env.is_main:
        (result_dir / f"{name}.json").write_text(json.dumps(result))
    barrier()


def main() -> None:
    faulthandler.enable()  # a native crash prints where each rank was
    result_dir, *runs = sys.argv[1:]
    named = [(name, overrides.split(",")) for name, _, overrides in (run.partition("=") for run in runs)]
    # One process group for every run: their distributed.* settings are the same.
    with distributed(load_config(named[0][1]).distributed) as env:
        for name, overrides in named:
            train(name, overrides, Path(result_dir), env)


if __name__ == "__main__":
    main()
