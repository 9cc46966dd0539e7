"""Resumable checkpoints: written atomically by global rank 0, read by every rank onto its own device.

One file per checkpoint, ``checkpoints/step-00000123.pt``, holding the training state (model without
``module.`` prefixes, optimizer, scheduler, scaler, progress) and every rank's RNG states. A file only
gets its final name once it is complete (temporary file, fsync, ``os.replace``), so a kill mid-write
leaves the previous checkpoint as the newest.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from .distributed import DistEnv, broadcast_object, gather_objects
from .log import log
from .rng import capture_rng_state, restore_rng_state
from .state import TrainingState

FORMAT_VERSION = 2
NAME = re.compile(r"step-(\d+)\.pt")


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be used for this run."""


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

    def save(self, state: TrainingState) -> None:
        # Collective: every rank contributes its RNG state, so it must be called on all ranks.
        rng_states = gather_objects(capture_rng_state(), self.env)
        if not self.env.is_main:
            return
        payload = {"format": FORMAT_VERSION, "world_size": self.env.world_size, "rng": rng_states}
        payload.update(state.state_dict())
        self.directory.mkdir(parents=True, exist_ok=True)
        for torn in self.directory.glob(".step-*.partial"):  # left by a run killed mid-write
            torn.unlink(missing_ok=True)
        final = self.directory / f"step-{state.progress.step:08d}.pt"
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

    def load_latest(self, state: TrainingState, seed: int) -> bool:
        """Restore the newest readable checkpoint into ``state``; every rank reads the file rank 0 chose.
        False when there is none."""
        candidates = broadcast_object([str(path) for path in self.existing()], self.env)
        for candidate in map(Path, candidates):
            try:
                payload = torch.load(candidate, map_location="cpu", weights_only=False)
                _check_format(payload)
            except Exception as error:  # torn or foreign file: fall back to the one before
                log.warning(f"skipping unreadable checkpoint {candidate}: {error}")
                continue
            _restore(candidate, payload, state, self.env, seed)
            progress = state.progress
            log.info(f"resumed from {candidate} (step {progress.step}, epoch {progress.epoch})")
            return True
        return False


def _check_format(payload: Any) -> None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise CheckpointError("not a checkpoint of this project")


def _restore(path: Path, payload: dict[str, Any], state: TrainingState, env: DistEnv, seed: int) -> None:
    try:
        state.load_state_dict(payload)
    except (RuntimeError, ValueError, KeyError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(
            f"{path} does not fit this model ({first_line}); "
            "use a new output_dir to train this model from scratch"
        ) from None
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
