"""Custom model type: your own ``nn.Module``, loss and data on the shared DDP loop.

Everything you need to change is in the three blocks marked ``YOUR CODE``; the distributed set-up,
mixed precision, accumulation, evaluation, checkpoints and ``final/`` keep working unchanged. The default
is a small classifier on synthetic data, so the project trains out of the box.

Data files (``data.train_file`` / ``data.val_file``) are ``.pt`` files holding
``{"inputs": FloatTensor[N, FEATURES], "targets": LongTensor[N]}``; with no files the synthetic data set
is used. ``model.pretrained`` may name a directory holding a ``model.safetensors`` (a previous
``final/``) to start from; empty means a fresh model. ``TASK`` at the end hands it all to the shared loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from ..config import Config
from ..data.loader import DataError
from ..parallel.process_group import DistEnv
from ..task.spec import Batch, Task, TaskData, at_least_fp32

# ---- YOUR CODE 1: the model ----------------------------------------------------------------------
MODEL_CONFIG = {"in_features": 32, "hidden": 64, "classes": 4}


class Model(nn.Module):
    # distributed.strategy=fsdp2 shards a model block by block: a model of repeated blocks names their
    # class here, `_no_split_modules = ["Block"]` (or a run passes distributed.fsdp_wrap=Block).

    def __init__(self, in_features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)


# ---- YOUR CODE 2: the loss -----------------------------------------------------------------------
def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss summed over the batch: the shared loop divides by the samples of the whole step (all
    micro-batches and ranks), and evaluation adds the sums up over every batch."""
    return F.cross_entropy(at_least_fp32(outputs), targets, reduction="sum")


# ---- YOUR CODE 3: the data -----------------------------------------------------------------------
def load_inputs(path: str, required: tuple[str, ...] = ("inputs",)) -> dict[str, torch.Tensor]:
    """The tensors of a data file, its ``inputs`` checked; predict reads files without ``targets`` too."""
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise DataError(f"{path}: not a readable .pt file ({type(error).__name__})") from None
    if not isinstance(content, dict) or set(required) - content.keys():
        raise DataError(f"{path}: expected a dict with {' and '.join(map(repr, required))} tensors")
    inputs = content["inputs"]
    if inputs.ndim != 2 or inputs.shape[1] != MODEL_CONFIG["in_features"]:
        raise DataError(
            f"{path}: 'inputs' has shape {tuple(inputs.shape)}, expected (N, {MODEL_CONFIG['in_features']})"
        )
    return content


def load_split(path: str) -> Dataset:
    content = load_inputs(path, ("inputs", "targets"))
    inputs, targets = content["inputs"], content["targets"]
    if targets.shape != (inputs.shape[0],) or targets.dtype != torch.long:
        raise DataError(f"{path}: 'targets' must be an int64 tensor of shape ({inputs.shape[0]},)")
    if len(targets) and not 0 <= int(targets.min()) <= int(targets.max()) < MODEL_CONFIG["classes"]:
        raise DataError(f"{path}: 'targets' must be class ids in 0..{MODEL_CONFIG['classes'] - 1}")
    return TensorDataset(inputs.float(), targets)


TEACHER_SEED = 1234


def synthetic_split(seed: int, size: int) -> TensorDataset:
    """Random points labelled by one fixed random teacher: learnable, and the same on every rank."""
    features, classes = MODEL_CONFIG["in_features"], MODEL_CONFIG["classes"]
    teacher = torch.randn(features, classes, generator=torch.Generator().manual_seed(TEACHER_SEED))
    inputs = torch.randn(size, features, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(inputs, (inputs @ teacher).argmax(dim=1))


# ---- The shared loop's interface (see task/spec.py); no need to edit below ---------------------


def build_data(config: Config, env: DistEnv) -> TaskData:
    if config.data.train_file:
        train = load_split(config.data.train_file)
    else:
        train = synthetic_split(config.seed, 2048)
    val: Dataset | None
    if config.data.val_file:
        val = load_split(config.data.val_file)
    else:
        val = None if config.data.train_file else synthetic_split(config.seed + 1, 509)
    return TaskData(train=train, val=val, collate=collate, label_names=[])


def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
    inputs, targets = zip(*samples, strict=True)
    return {"inputs": torch.stack(inputs), "targets": torch.stack(targets)}


def build_model(config: Config, data: TaskData) -> nn.Module:
    model = Model(**MODEL_CONFIG)
    if config.model.pretrained:
        load_model(model, Path(config.model.pretrained) / "model.safetensors")
    return model


def loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    return loss_fn(model(batch["inputs"]), batch["targets"])


def evaluation_sums(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    outputs, targets = model(batch["inputs"]), batch["targets"]
    return {
        "loss": loss_fn(outputs, targets),
        "correct": (outputs.argmax(dim=-1) == targets).sum(),
        "count": torch.tensor(targets.numel(), device=targets.device),
    }


def evaluation_metrics(sums: dict[str, float]) -> dict[str, float]:
    return {"eval_loss": sums["loss"] / sums["count"], "eval_accuracy": sums["correct"] / sums["count"]}


def save_final(model: nn.Module, data: TaskData, directory: Path) -> None:
    save_weights(model, directory)


def save_weights(model: nn.Module, directory: Path) -> None:
    """``model.safetensors`` plus the constructor arguments in ``config.json``. ``save_model`` keeps one
    copy of tensors that share memory (tied weights), which a plain state dict would hold twice."""
    save_model(model, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n", encoding="utf-8")


TASK = Task(
    build_data=build_data,
    build_model=build_model,
    loss_sum=loss_sum,
    evaluation_sums=evaluation_sums,
    sum_names=("loss", "correct", "count"),
    evaluation_metrics=evaluation_metrics,
    save_final=save_final,
)
