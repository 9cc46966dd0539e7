"""The set-up phases of a run: output folder, precision, model download, training state."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from ..config import Config, Precision
from ..observe.log import log
from ..parallel.checkpoint import Resumed
from ..parallel.ddp import enable_gradient_checkpointing, trainable_share
from ..parallel.precision import effective_precision, fallback_warning
from ..parallel.process_group import DistEnv, barrier, main_process_first
from ..parallel.strategy import Parallel
from ..parallel.training_state import TrainingState
from .optim import build_optimizer, build_scheduler

# What one run leaves in output_dir, moved aside whole by checkpoint.start_over (the cache stays: it
# depends on the data only).
RUN_OUTPUTS = (
    "checkpoints",
    "final",
    "metrics.jsonl",
    "metrics.png",
    "samples.jsonl",
    "config.yaml",
    "tracker.json",
    "tensorboard",
)


def prepare_output_dir(config: Config, env: DistEnv) -> Path:
    """The output folder; with ``checkpoint.start_over``, the previous run's outputs moved into
    ``previous-<n>/`` first (nothing is deleted)."""
    output_dir = Path(config.output_dir)
    if env.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        if config.checkpoint.start_over:
            _move_previous_run(output_dir)
    barrier()  # no rank looks for checkpoints while rank 0 moves them
    return output_dir


def _move_previous_run(output_dir: Path) -> None:
    present = [output_dir / name for name in RUN_OUTPUTS if (output_dir / name).exists()]
    if not present:
        return
    number = 1
    while (output_dir / f"previous-{number}").exists():
        number += 1
    previous = output_dir / f"previous-{number}"
    previous.mkdir()
    for path in present:
        path.rename(previous / path.name)
    log.info(f"checkpoint.start_over: the previous run's outputs are now in {previous}")


def record_config(output_dir: Path, config: Config, resumed: Resumed | None, env: DistEnv) -> None:
    """Write ``config.yaml``. A resume with other settings than the run it continues logs each change,
    and keeps that run's config.yaml beside the new one, so the files say which settings made which steps."""
    new = config.to_yaml()
    if resumed is not None:
        changes = changed_settings(resumed, new, env.world_size)
        current = output_dir / "config.yaml"
        if changes and env.is_main:
            kept = output_dir / f"config.up-to-step-{resumed.step}.yaml"
            if current.exists():
                current.rename(kept)
            else:
                kept.write_text(resumed.config_yaml, encoding="utf-8")
            listed = "; ".join(changes)
            log.warning(
                f"resuming step {resumed.step} with changed settings: {listed}; {kept.name} has the old"
            )
    if env.is_main:
        (output_dir / "config.yaml").write_text(new, encoding="utf-8")


def changed_settings(resumed: Resumed, new_yaml: str, world_size: int) -> list[str]:
    """``key old -> new`` for every setting that differs, with the global batch first where it changed."""
    old = _flat(OmegaConf.to_container(OmegaConf.create(resumed.config_yaml)))
    new = _flat(OmegaConf.to_container(OmegaConf.create(new_yaml)))
    changes = [f"{key} {old.get(key)} -> {new.get(key)}" for key in new if old.get(key) != new.get(key)]
    before = old.get("data.batch_size", 0) * old.get("train.grad_accum_steps", 0) * resumed.world_size
    after = new["data.batch_size"] * new["train.grad_accum_steps"] * world_size
    if before != after:
        changes.insert(
            0, f"global batch {before} -> {after} (processes {resumed.world_size} -> {world_size})"
        )
    return changes


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    return {
        key: value for name, child in tree.items() for key, value in _flat(child, f"{prefix}{name}.").items()
    }


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
    model: nn.Module, config: Config, env: DistEnv, total_steps: int, parallel: Parallel
) -> TrainingState:
    """The model on this rank's device, wrapped for DDP or sharded for FSDP2, with its optimizer,
    schedule and loss scaler.

    Gradient checkpointing and LoRA adapters go in before the model is wrapped: DDP and FSDP2 see the
    adapters (FSDP2 shards them with the blocks they sit in), and the optimizer takes the trainable
    parameters. Every rank then loads the same checkpoint (if any) into the result, so wrapping before
    loading is safe.
    """
    if config.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if config.lora is not None:
        from ..task.lora import add_adapters  # peft: only runs that train adapters import it

        model = add_adapters(model, config.lora, config.seed)
    if env.is_main:
        log.info(trainable_share(model))
    wrapped = parallel.wrap(model)  # on this rank's device; FSDP2 moves it there one block at a time
    optimizer = build_optimizer(model, config.train, env.device)
    return TrainingState(
        model=wrapped,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, config.train, total_steps),
        scaler=parallel.grad_scaler(),
        frozen_base=config.lora is not None,
    )
