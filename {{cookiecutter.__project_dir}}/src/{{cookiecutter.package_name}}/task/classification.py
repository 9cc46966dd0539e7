"""Loss, evaluation sums and metrics of classifiers (one label per sample): shared by the model types
that classify, given a function from a batch to logits."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config.cli import whole_number
from .spec import Batch, at_least_fp32

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


def add_top_k(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--top-k",
        type=whole_number(0),
        default=0,
        metavar="K",
        help="also write the K most likely classes with their probabilities as `scores` (default: 0)",
    )


def class_names(id2label: dict[int, str]) -> list[Any]:
    """Class names by id, as a model saved them; integer labels (names "0", "1", ...) as integers."""
    names = [id2label[index] for index in range(len(id2label))]
    return list(range(len(names))) if names == [str(index) for index in range(len(names))] else names


def prediction_records(logits: torch.Tensor, names: Sequence[Any], top_k: int) -> list[dict[str, Any]]:
    """Per row: the most likely class as ``label`` with its probability as ``score``, and with
    ``top_k`` > 0 the ``top_k`` most likely as ``scores`` ([{"label", "score"}, ...], best first)."""
    probabilities = logits.float().softmax(dim=-1).cpu()
    values, indices = probabilities.topk(min(max(top_k, 1), probabilities.shape[-1]), dim=-1)
    records = []
    for row_values, row_indices in zip(values.tolist(), indices.tolist(), strict=True):
        record: dict[str, Any] = {"label": names[row_indices[0]], "score": row_values[0]}
        if top_k > 0:
            pairs = zip(row_indices, row_values, strict=True)
            record["scores"] = [{"label": names[index], "score": value} for index, value in pairs]
        records.append(record)
    return records
