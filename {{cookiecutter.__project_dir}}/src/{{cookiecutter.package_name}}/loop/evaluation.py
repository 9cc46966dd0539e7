"""Exact distributed evaluation: each validation sample is seen once, on one rank, and sums are reduced."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..data.loader import to_device
from ..data.sampling import EvalBatches
from ..parallel.ddp import unwrap
from ..parallel.process_group import DistEnv, all_reduce_sum
from ..parallel.strategy import Parallel
from ..task.spec import Task


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    batches: EvalBatches,
    task: Task,
    env: DistEnv,
    parallel: Parallel,
) -> dict[str, float]:
    """Metrics over every validation sample, bitwise the same for any number of processes."""
    # The bare module: ranks hold different numbers of batches, and DDP's forward would try to sync.
    # (FSDP2's hooks live on the module itself: its forward gathers each block from the other ranks.)
    module = unwrap(model)
    was_training = module.training
    module.eval()
    keys = task.sum_names
    # One row per global batch, filled only by the rank that owns it. The all-reduce then adds zeros to
    # each value, which is exact, and every rank sums the rows in the same order: no dependence on the
    # world size or the reduction order.
    rows = torch.zeros(batches.total_batches, len(keys), dtype=torch.float64, device=env.device)
    for batch_id, batch in zip(batches.batch_ids, loader, strict=True):
        with parallel.autocast():
            sums = task.evaluation_sums(module, to_device(batch, env.device))
        rows[batch_id] = torch.stack([sums[key].double() for key in keys])
    if parallel.equal_forwards:
        # Each FSDP2 forward gathers parameters with every rank: a rank with fewer batches runs forwards
        # of one sample until it has run as many as the others, and discards them.
        padding = math.ceil(batches.total_batches / env.world_size) - len(batches.batch_ids)
        for _ in range(padding):
            filler = to_device(loader.collate_fn([loader.dataset[0]]), env.device)
            with parallel.autocast():
                task.evaluation_sums(module, filler)
    module.train(was_training)
    all_reduce_sum(rows)
    totals = rows.sum(dim=0)
    return task.evaluation_metrics(dict(zip(keys, totals.tolist(), strict=True)))
