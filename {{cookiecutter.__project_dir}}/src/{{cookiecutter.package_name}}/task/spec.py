"""What a model type provides to the shared loop: one ``Task`` built in ``model_type/task.py``, and to
``python -m <package>.predict``: one ``Prediction`` built in ``model_type/predict.py``.

The trainer, evaluation and checkpoints call nothing of a model type but the fields of ``Task``, and the
model type hands its data over as a ``TaskData``. A new model type is a copy of the ``model_type/`` folder
with these filled in (see the README, "Your own model type"); mypy checks each function against the field
it fills.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

if TYPE_CHECKING:
    from ..config import Config
    from ..parallel.process_group import DistEnv

Batch = dict[str, torch.Tensor]


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """Losses are computed in fp32 whatever the autocast dtype; a float64 run stays float64."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def dataset_size(dataset: Dataset) -> int:
    """The length of a map-style dataset (torch's ``Dataset`` type does not declare ``__len__``)."""
    return len(dataset)  # type: ignore[arg-type]


def count_samples(batch: Batch) -> int:
    return len(next(iter(batch.values())))


def count_real_tokens(batch: Batch) -> int:
    """Tokens that are not padding, counted on the host before the batch moves: no device sync."""
    return int(batch["attention_mask"].sum())


@dataclass
class TaskData:
    """The data of one run, as a model type hands it to the shared loop."""

    train: Dataset
    val: Dataset | None
    collate: Callable[[list[Any]], Batch]
    # Class names by id (classification types): saved with the model, reported by predict.
    label_names: list[str]
    # What turns raw inputs into model inputs (a tokenizer, an image processor): saved in final/.
    preprocessor: Any = None
    # The positions a batch puts through the model (tokens, image patches; one per sample by default):
    # tokens_per_s and mfu in metrics.jsonl count these.
    count_tokens: Callable[[Batch], int] = count_samples
    # Sample lengths, to batch samples of similar length together (less padding); None: random batches.
    train_lengths: Sequence[int] | torch.Tensor | None = None
    val_lengths: Sequence[int] | torch.Tensor | None = None
    # False: random training batches even with train_lengths, which then serve only the largest-batch
    # check before the first step (loop/longest_batch.py).
    group_by_length: bool = True
    # True when __getitem__ draws augmentations from the DataLoader workers' seed, which is new each
    # epoch only if the workers are: such data gets no persistent workers.
    reseeds_workers: bool = False


@dataclass(frozen=True)
class Task:
    """A model type: data, model, loss, evaluation and the saved model."""

    build_data: Callable[[Config, DistEnv], TaskData]
    """Datasets and collate function of the run; runs on every rank (caches are shared: data/cache.py)."""
    build_model: Callable[[Config, TaskData], nn.Module]
    """The pretrained model with its head sized from the data, in fp32 on the CPU."""
    loss_sum: Callable[[nn.Module, Batch], torch.Tensor]
    """The loss summed over the batch's targets (samples, or target tokens): the trainer divides by the
    number of targets in the whole optimizer step, over every micro-batch and rank."""
    evaluation_sums: Callable[[nn.Module, Batch], dict[str, torch.Tensor]]
    """Sums over one evaluation batch, named as in ``sum_names``; they add up over batches and ranks."""
    sum_names: tuple[str, ...]
    evaluation_metrics: Callable[[dict[str, float]], dict[str, float]]
    """``eval_loss`` and the type's metric, from the totals of ``evaluation_sums``."""
    save_final: Callable[[nn.Module, TaskData, Path], None]
    """The fine-tuned model into a folder, loadable the way its users load it."""
    count_targets: Callable[[Batch], int] | None = None
    """The targets ``loss_sum`` adds up in a host batch; None: one per sample (every rank's step then
    holds the same number, and the trainer needs no count from the other ranks)."""
    generate: Callable[[nn.Module, TaskData, int, int, torch.device], list[dict[str, Any]]] | None = None
    """Greedy completions of the first n validation prompts, up to a number of new tokens each, one
    JSON record per prompt (eval.generate_samples); runs on every rank, with as many forwards on each.
    None: the type generates nothing."""


class PredictError(ValueError):
    """A model folder or an option that predict cannot use; the message names it and the fix."""


class Predictor(Protocol):
    """A fine-tuned model of this project's type, loaded for ``python -m <package>.predict``.

    The command reads the inputs, prepares them all, sorts them by ``length`` into batches (longest
    first, so a batch that does not fit in memory fails at once) and writes ``predict``'s records back
    in input order.
    """

    def prepare(self, inputs: list[Any]) -> list[Any]:
        """Model-ready items (token ids, image paths, rows), one per input, in input order."""
        ...

    def length(self, item: Any) -> int:
        """What batches group by (tokens of a text); the same for every item: batches in input order."""
        ...

    def predict(self, batch: list[Any]) -> list[dict[str, Any]]:
        """One JSON record per item, in batch order."""
        ...


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """A model type without options of its own."""


@dataclass(frozen=True)
class Prediction:
    """What ``python -m <package>.predict MODEL_DIR INPUT`` calls of a model type."""

    read_inputs: Callable[[Path], list[Any]]
    """The inputs of a file (or folder) in the type's own data format, in order; bad input raises
    DataError naming the file and line, as training does."""
    load: Callable[[Path, argparse.Namespace, torch.device], Predictor]
    """The model saved in a folder (a run's final/), on the device, with the type's options applied."""
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    """The type's own options (--top-k, --max-new-tokens, ...)."""
