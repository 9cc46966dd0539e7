"""Stop at the first non-finite loss or gradient norm, before anything non-finite is saved.

Each step folds its loss (and, when clipping computes it, the gradient norm) into a flag on the device,
without a host synchronisation; the flag is read on logging steps and before every checkpoint, where the
loop synchronises anyway. fp16's gradient scaler skips steps with inf gradients on purpose, so under it
only the loss counts.
"""

from __future__ import annotations

import torch

from ..config.validation import ConfigError
from ..parallel.process_group import all_reduce_sum


class TrainingDiverged(ConfigError):
    """The loss or the gradients became inf or nan: the settings, not the code, need a change."""


class NonFiniteGuard:
    def __init__(self, device: torch.device, lr: float, clipping: bool) -> None:
        self.first_bad_step = torch.zeros((), dtype=torch.float64, device=device)  # 0: none yet
        self.lr, self.clipping = lr, clipping

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        bad = ~torch.isfinite(loss)
        if grad_norm is not None:
            bad = bad | ~torch.isfinite(grad_norm)
        unset = self.first_bad_step == 0
        self.first_bad_step = torch.where(bad & unset, float(step), self.first_bad_step)

    def check(self) -> None:
        """A collective: every rank raises, or none does."""
        reached = all_reduce_sum(torch.stack([(self.first_bad_step > 0).double(), self.first_bad_step]))
        ranks, steps = reached.tolist()
        if not ranks:
            return
        fix = "lower train.lr" if self.clipping else "set train.max_grad_norm (clipping) or lower train.lr"
        raise TrainingDiverged(
            f"step {round(steps / ranks)}: the loss or the gradients are not finite (inf or nan) at "
            f"train.lr={self.lr:g}; {fix}; nothing after the last finite step was saved"
        )
