"""Exact distributed evaluation: each validation sample is seen once, on one rank, and sums are reduced."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn
from torch.utils.data import DataLoader

from .config import Precision
from .data import to_device
from .distributed import DistEnv, all_reduce_sum
from .model import unwrap
from .precision import autocast


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, task: ModuleType, env: DistEnv, precision: Precision
) -> dict[str, float]:
    # The bare module: ranks may hold different numbers of batches, and DDP's forward would try to sync.
    module = unwrap(model)
    was_training = module.training
    module.eval()
    keys = task.EVALUATION_SUMS
    # Zeros first: a rank whose shard is empty still joins the reduction with the same shape.
    totals = torch.zeros(len(keys), dtype=torch.float64, device=env.device)
    for batch in loader:
        with autocast(precision, env.device):
            sums = task.evaluation_sums(module, to_device(batch, env.device))
        totals += torch.stack([sums[key].double() for key in keys])
    module.train(was_training)
    all_reduce_sum(totals)
    return task.evaluation_metrics(dict(zip(keys, totals.tolist(), strict=True)))
