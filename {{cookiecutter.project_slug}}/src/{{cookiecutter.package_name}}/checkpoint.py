"""Resumable checkpoints: written atomically by global rank 0, read by every rank onto its own device.

One file per checkpoint, ``checkpoints/step-00000123.pt``, holding the model (without ``module.``
prefixes), optimizer, scheduler, scaler, the training position and every rank's RNG states. A file only
gets its final name once it is complete (temporary file, fsync, ``os.replace``), so a kill mid-write
leaves the previous checkpoint as the newest.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .distributed import DistEnv, broadcast_object, gather_objects
from .metrics import log
from .model import unwrap
from .rng import capture_rng_state, restore_rng_state

FORMAT_VERSION = 1
NAME = re.compile(r"step-(\d+)\.pt")


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used for this run."""


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch in progress
    epoch_samples: int = 0  # samples of this epoch the whole job has consumed (all ranks together)


class Checkpointer:
    def __init__(self, directory: Path, env: DistEnv, keep_last: int) -> None:
        self.directory = directory
        self.env = env
        self.keep_last = keep_last

    def existing(self) -> list[Path]:
        """Complete checkpoints, newest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := NAME.fullmatch(p.name))]
        return [path for _, path in sorted(found, reverse=True)]

    def save(self, state: TrainState, model: nn.Module, optimizer, scheduler, scaler) -> None:
        # Collective: every rank contributes its RNG state, so it must be called on all ranks.
        rng_states = gather_objects(capture_rng_state(), self.env)
        if not self.env.is_main:
            return
        payload = {
            "format": FORMAT_VERSION,
            "train_state": asdict(state),
            "world_size": self.env.world_size,
            "model": unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng_states,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        for torn in self.directory.glob(".step-*.partial"):  # left by a run killed mid-write
            torn.unlink(missing_ok=True)
        final = self.directory / f"step-{state.step:08d}.pt"
        partial = self.directory / f".{final.name}.partial"
        with partial.open("wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, final)
        _fsync_directory(self.directory)
        log.info(f"checkpoint saved: {final}")
        for old in self.existing()[self.keep_last :]:
            old.unlink(missing_ok=True)

    def load_latest(self, model: nn.Module, optimizer, scheduler, scaler, seed: int) -> TrainState | None:
        """Restore the newest readable checkpoint; every rank reads the file rank 0 chose."""
        candidates = broadcast_object([str(path) for path in self.existing()], self.env)
        for candidate in map(Path, candidates):
            try:
                payload = torch.load(candidate, map_location="cpu", weights_only=False)
                _check_format(payload)
            except Exception as error:  # torn or foreign file: fall back to the one before
                log.warning(f"skipping unreadable checkpoint {candidate}: {error}")
                continue
            _restore(candidate, payload, model, optimizer, scheduler, scaler, self.env, seed)
            state = TrainState(**payload["train_state"])
            log.info(f"resumed from {candidate} (step {state.step}, epoch {state.epoch})")
            return state
        return None


def _check_format(payload: Any) -> None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise CheckpointError("not a checkpoint of this project")


def _restore(path: Path, payload: dict[str, Any], model, optimizer, scheduler, scaler, env, seed) -> None:
    try:
        unwrap(model).load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"{path} does not fit this model ({first_line}); "
            "use a new output_dir to train this model from scratch"
        ) from None
    scheduler.load_state_dict(payload["scheduler"])
    scaler.load_state_dict(payload["scaler"])
    rng_states = payload["rng"]
    if len(rng_states) == env.world_size:
        restore_rng_state(rng_states[env.rank])
    else:
        log.warning(
            f"checkpoint was written by {len(rng_states)} processes, this run has {env.world_size}: "
            "random states are re-seeded, so the run is not bit-identical to an uninterrupted one"
        )
        torch.manual_seed(seed + env.rank)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
