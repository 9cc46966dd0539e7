"""Resumable checkpoints: the newest complete one wins, and every rank resumes from the same one.

Two layouts, one per ``distributed.strategy``:

- ``ddp``: one file per checkpoint, ``checkpoints/step-00000123.pt``, written by global rank 0 (below). It
  holds the training state (model without ``module.`` prefixes, optimizer, scheduler, scaler, progress),
  every rank's RNG states and the run's configuration.
- ``fsdp2``: one directory per checkpoint, ``checkpoints/step-00000123/``, that every rank writes its
  shards into (parallel/sharded_checkpoint.py); any number of processes can resume it.

A checkpoint only gets its final name once it is complete (temporary name, fsync, rename), so a kill
mid-write leaves the previous checkpoint as the newest.

Nothing read from ``output_dir`` can run code: single files hold tensors and plain values only and are
loaded with ``weights_only=True`` (a planted pickle is refused as unreadable), memory-mapped, so the ranks
of a node share the file's pages instead of each holding a copy of the optimizer state.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from . import liveness
from .process_group import DistEnv, broadcast_object, gather_objects
from .rng import capture_rng_state, restore_rng_state
from .training_state import TrainingState

log = logging.getLogger(__name__)  # the package's logger (observe/log.py) shows it

FORMAT_VERSION = 3
NAME = re.compile(r"step-(\d+)(\.pt)?")  # a file (ddp) or a directory (fsdp2)


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used for this run; the message says what to do."""


@dataclass(frozen=True)
class Resumed:
    path: Path
    step: int
    config_yaml: str
    """The configuration of the run that wrote the checkpoint."""
    world_size: int


def step_of(path: Path) -> int:
    match = NAME.fullmatch(path.name)
    assert match, path
    return int(match.group(1))


def describe_newest(directory: Path) -> str:
    """Where a run of the same command would resume from, for a message."""
    steps = [step_of(p) for p in directory.iterdir() if NAME.fullmatch(p.name)] if directory.is_dir() else []
    return f"the newest complete checkpoint is step {max(steps)}" if steps else "there is no checkpoint yet"


class Layout(Protocol):
    """How checkpoints of one strategy are written and read; the Checkpointer decides which and when."""

    def path_for(self, directory: Path, step: int) -> Path: ...

    def write(
        self, state: TrainingState, header: dict[str, Any], final: Path, published: Callable[[Path], None]
    ) -> None:
        """A collective: write ``header`` (world size, config, RNG states) and ``state`` to ``final``, and
        call ``published(final)`` on rank 0 once it is complete under that name."""

    def wait(self) -> None:
        """Return once no checkpoint is being written any more (raises what the write raised)."""

    def read(self, path: Path) -> dict[str, Any]:
        """Everything but the tensors a restore needs, on this rank alone; raises when unusable."""

    def restore(self, path: Path, payload: dict[str, Any], state: TrainingState) -> None:
        """A collective: load the checkpoint into ``state``."""


class SingleFile:
    """ddp's layout: rank 0 writes the whole state into one file; every rank reads it memory-mapped."""

    def __init__(self, env: DistEnv) -> None:
        self.env = env

    def path_for(self, directory: Path, step: int) -> Path:
        return directory / f"step-{step:08d}.pt"

    def write(
        self, state: TrainingState, header: dict[str, Any], final: Path, published: Callable[[Path], None]
    ) -> None:
        if not self.env.is_main:
            return
        payload = {"format": FORMAT_VERSION, **header, **state.state_dict()}
        partial = final.with_name(f".{final.name}.partial")
        try:
            with partial.open("wb") as handle:
                torch.save(payload, handle)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, final)
        fsync_directory(final.parent)
        published(final)

    def wait(self) -> None:
        return None

    def read(self, path: Path) -> dict[str, Any]:
        if path.is_dir():
            raise CheckpointError(
                "a sharded checkpoint of distributed.strategy=fsdp2; resume with distributed.strategy=fsdp2"
            )
        return _read(path)

    def restore(self, path: Path, payload: dict[str, Any], state: TrainingState) -> None:
        state.load_state_dict(payload)


class Checkpointer:
    def __init__(self, directory: Path, env: DistEnv, keep_last: int, layout: Layout | None = None) -> None:
        self.directory = directory
        self.env = env
        self.keep_last = keep_last
        self.layout: Layout = layout or SingleFile(env)
        self.writing_step = 0

    def existing(self) -> list[Path]:
        """Complete checkpoints, newest first."""
        if not self.directory.is_dir():
            return []
        return sorted(
            (p for p in self.directory.iterdir() if NAME.fullmatch(p.name)), key=step_of, reverse=True
        )

    def save(self, state: TrainingState, config_yaml: str) -> None:
        """A collective: every rank contributes its RNG state (and, for fsdp2, its shards)."""
        self.wait()  # a checkpoint still being written in the background is published first
        liveness.ensure_not_cut_off()
        rng_states = gather_objects(capture_rng_state(), self.env)
        header = {
            "world_size": self.env.world_size,
            "config": config_yaml,
            "rng": rng_states,
            "frozen_base": state.frozen_base,
        }
        self.writing_step = state.progress.step
        final = self.layout.path_for(self.directory, state.progress.step)
        if self.env.is_main:
            self.directory.mkdir(parents=True, exist_ok=True)
            for torn in self.directory.glob(".step-*.partial"):  # left by a run killed mid-write
                remove(torn)
        try:
            self.layout.write(state, header, final, self.published)
        except OSError as error:
            raise self.explained(error) from None

    def wait(self) -> None:
        """Return once no checkpoint is being written any more: before exiting, or stopping for preemption."""
        try:
            self.layout.wait()
        except OSError as error:
            raise self.explained(error) from None

    def explained(self, error: OSError) -> Exception:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            return error
        return CheckpointError(
            f"{self.directory}: no space left to write the checkpoint of step {self.writing_step}; "
            "free space there or use an output_dir on a larger volume, then run again to resume "
            "from the last checkpoint"
        )

    def published(self, final: Path) -> None:
        log.info(f"checkpoint saved: {final}")
        self.retain(final)

    def retain(self, written: Path) -> None:
        """Keep ``checkpoint.keep_last`` checkpoints up to the one just written. Newer ones (left when
        a resume skipped them as unreadable) are never deleted: they may read again, e.g. on NFS."""
        older = [path for path in self.existing() if step_of(path) < step_of(written)]
        for old in older[self.keep_last - 1 :]:
            remove(old)

    def load_latest(self, state: TrainingState, seed: int) -> Resumed | None:
        """Restore the newest checkpoint every rank can read into ``state``; None when there is none.

        Every rank tries rank 0's list of candidates, newest first, and the ranks then compare what they
        read: they resume from the same checkpoint, or the run stops. Existing checkpoints that no rank
        can read stop the run too, instead of silently training from step 0 over them.
        """
        candidates = [Path(path) for path in broadcast_object([str(p) for p in self.existing()], self.env)]
        chosen, payload, problems = None, None, []
        for index, candidate in enumerate(candidates):
            try:
                payload = self.layout.read(candidate)
            except Exception as error:  # torn, foreign or planted: try the one before
                problems.append(f"{candidate.name}: {_reason(error)}")
                continue
            chosen = index
            break
        choices = gather_objects(chosen, self.env)
        if len(set(choices)) > 1:
            read = ", ".join(
                f"rank {rank} {candidates[c].name if c is not None else 'none'}"
                for rank, c in enumerate(choices)
            )
            raise CheckpointError(
                f"the ranks read different checkpoints in {self.directory} ({read}); make sure every node "
                "sees output_dir alike (shared storage), then run again"
            )
        if chosen is None:
            if candidates:
                raise CheckpointError(
                    f"{self.directory} holds {len(candidates)} checkpoint(s) and none can be read "
                    f"({'; '.join(problems[:3])}); use a new output_dir, or add checkpoint.start_over=true "
                    "to move them aside and train from step 0"
                )
            return None
        assert payload is not None
        for problem in problems if self.env.is_main else []:
            log.warning(f"skipping unreadable checkpoint {self.directory / problem}")
        path = candidates[chosen]
        self._restore(path, payload, state, seed)
        log.info(f"resumed from {path} (step {state.progress.step}, epoch {state.progress.epoch})")
        return Resumed(path, state.progress.step, payload["config"], payload["world_size"])

    def _restore(self, path: Path, payload: dict[str, Any], state: TrainingState, seed: int) -> None:
        if payload.get("frozen_base", False) != state.frozen_base:
            raise CheckpointError(mixed_finetuning(path, lora_checkpoint=not state.frozen_base))
        try:
            self.layout.restore(path, payload, state)
        except (RuntimeError, ValueError, KeyError) as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise CheckpointError(
                f"{path} does not fit this model ({first_line}); "
                "use a new output_dir to train this model from scratch"
            ) from None
        rng_states = payload["rng"]
        if len(rng_states) == self.env.world_size:
            restore_rng_state(rng_states[self.env.rank])
        else:
            log.warning(
                f"checkpoint was written by {len(rng_states)} processes, this run has {self.env.world_size}: "
                "random states are re-seeded, so the run is not bit-identical to an uninterrupted one"
            )
            torch.manual_seed(seed + self.env.rank)


def mixed_finetuning(path: Path, lora_checkpoint: bool) -> str:
    """A run with LoRA adapters cannot continue a run that trained every parameter, nor the reverse."""
    if lora_checkpoint:
        held, this_run, fix = "LoRA adapters", "trains every parameter", "the lora settings that wrote it"
    else:
        held, this_run, fix = "every parameter", "trains LoRA adapters", "lora=null"
    return (
        f"{path} holds a run that trained {held}, and this run {this_run}; resume with {fix}, or use a new "
        "output_dir (checkpoint.start_over=true moves the old run aside)"
    )


def _read(path: Path) -> dict[str, Any]:
    payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise CheckpointError("not a checkpoint of this project's format")
    return payload


def _reason(error: Exception) -> str:
    if isinstance(error, CheckpointError):
        return str(error)
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return f"{type(error).__name__}: {first_line[:200]}"


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
