"""Measurements that need real process groups; started by the tests with torchrun, never by users.

    torchrun --standalone --nproc-per-node=N tests/ddp_probe.py MODE RESULT.json key=value ...

``evaluate``: metrics of the untrained model, to compare across world sizes.
``sync``: all-reduce calls per optimizer step under gradient accumulation, and the replica check.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.loop.trainer import Trainer
from {{ cookiecutter.package_name }}.model_type.task import TASK
from {{ cookiecutter.package_name }}.parallel.process_group import (
    barrier,
    distributed,
)


def evaluate(trainer: Trainer) -> dict:
    trainer.evaluate()
    return trainer.last_eval


def sync(trainer: Trainer) -> dict:
    calls = [0]

    def counting_hook(state, bucket):  # DDP checks real annotations; this module's are strings
        calls[0] += 1
        return allreduce_hook(None, bucket)

    trainer.state.model.register_comm_hook(state=None, hook=counting_hook)
    batch_size, accumulation = trainer.config.data.batch_size, trainer.config.train.grad_accum_steps
    batches = iter(trainer.plan.train_loader)
    trainer.optimizer_step(batches, batch_size)  # one micro-batch: all-reduces of one step = buckets
    buckets = calls[0]
    steps = 3
    for _ in range(steps):
        trainer.optimizer_step(batches, accumulation * batch_size)
    trainer.verify_replicas()  # raises if the ranks differ
    if trainer.env.rank == 1:  # now make them differ on purpose: the check must notice
        with torch.no_grad():
            next(trainer.state.module.parameters()).add_(1.0)
    try:
        trainer.verify_replicas()
        divergence_detected = False
    except RuntimeError:
        divergence_detected = True
    return {
        "buckets": buckets,
        "steps": steps,
        "calls": calls[0] - buckets,
        "divergence_detected": divergence_detected,
    }


def main() -> None:
    faulthandler.enable()  # a native crash prints where each rank was
    mode, result_file, *overrides = sys.argv[1:]
    config = load_config(overrides)
    with distributed(config.distributed) as env:
        trainer = Trainer(config, TASK, env)
        result = {"evaluate": evaluate, "sync": sync}[mode](trainer)
        if env.is_main:
            Path(result_file).write_text(json.dumps(result))
        barrier()
        # The measurement is on disk on every rank's behalf. Skip the interpreter's teardown: with the
        # Python comm hook registered above, gloo's threads can abort a process as it exits ("terminate
        # called without an active exception"), which would fail a probe whose work is done.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
