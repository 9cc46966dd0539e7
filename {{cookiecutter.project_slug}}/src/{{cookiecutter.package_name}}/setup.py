"""The set-up phases of a run: output folder, precision, model download, training state."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from torch import nn

from .config import Config, Precision
from .distributed import DistEnv, main_process_first
from .log import log
from .model import wrap_ddp
from .optim import build_optimizer, build_scheduler
from .precision import effective_precision, fallback_warning, grad_scaler
from .state import TrainingState


def prepare_output_dir(config: Config, env: DistEnv) -> Path:
    output_dir = Path(config.output_dir)
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")
    return output_dir


def training_precision(requested: Precision, env: DistEnv) -> Precision:
    precision = effective_precision(requested, env.device)
    if precision is not requested and env.is_main:
        log.warning(fallback_warning(env.device))
    return precision


def download_first(pretrained: str, env: DistEnv) -> AbstractContextManager:
    """Rank 0 alone fetches a hub checkpoint, the others then read the cache; local paths load at once."""
    if not pretrained or Path(pretrained).exists():
        return nullcontext()
    return main_process_first(env)


def build_training_state(
    model: nn.Module, config: Config, env: DistEnv, total_steps: int, precision: Precision
) -> TrainingState:
    """The model on this rank's device, wrapped for DDP, with its optimizer, schedule and loss scaler.

    Every rank then loads the same checkpoint (if any) into it, so wrapping before loading is safe.
    """
    wrapped = wrap_ddp(model.to(env.device), env, config.distributed)
    optimizer = build_optimizer(model, config.train, env.device)
    return TrainingState(
        model=wrapped,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, config.train, total_steps),
        scaler=grad_scaler(precision, env.device),
    )
