"""Loss, evaluation sums and metrics of classifiers (one label per sample): shared by the model types
that classify, given a function from a batch to logits."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .task_spec import Batch, at_least_fp32

SUM_NAMES = ("loss", "correct", "count")
Logits = Callable[[nn.Module, Batch], torch.Tensor]


def loss_sum(logits: Logits, labels_key: str = "labels") -> Callable[[nn.Module, Batch], torch.Tensor]:
    """The summed cross-entropy of a batch, in fp32 whatever the autocast dtype."""

    def summed(model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(at_least_fp32(logits(model, batch)), batch[labels_key], reduction="sum")

    return summed


def evaluation_sums(
    logits: Logits, labels_key: str = "labels"
) -> Callable[[nn.Module, Batch], dict[str, torch.Tensor]]:
    def sums(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        scores, labels = at_least_fp32(logits(model, batch)), batch[labels_key]
        return {
            "loss": F.cross_entropy(scores, labels, reduction="sum").double(),
            "correct": (scores.argmax(dim=-1) == labels).sum().double(),
            "count": torch.tensor(float(labels.numel()), dtype=torch.float64, device=labels.device),
        }

    return sums


def evaluation_metrics(sums: dict[str, float]) -> dict[str, float]:
    return {"eval_loss": sums["loss"] / sums["count"], "eval_accuracy": sums["correct"] / sums["count"]}
