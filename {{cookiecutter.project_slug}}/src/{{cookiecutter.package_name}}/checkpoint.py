"""Resumable checkpoints: written atomically by global rank 0, read by every rank onto its own device.

One file per checkpoint, ``checkpoints/step-00000123.pt``, holding the training state (model without
``module.`` prefixes, optimizer, scheduler, scaler, progress), every rank's RNG states and the run's
configuration. A file only gets its final name once it is complete (temporary file, fsync,
``os.replace``), so a kill mid-write leaves the previous checkpoint as the newest.

Nothing read from ``output_dir`` can run code: checkpoints hold tensors and plain values only and are
loaded with ``weights_only=True`` (a planted pickle is refused as unreadable), memory-mapped, so the ranks
of a node share the file's pages instead of each holding a copy of the optimizer state.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .distributed import DistEnv, broadcast_object, gather_objects
from .log import log
from .rng import capture_rng_state, restore_rng_state
from .state import TrainingState

FORMAT_VERSION = 3
NAME = re.compile(r"step-(\d+)\.pt")


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


class Checkpointer:
    def __init__(self, directory: Path, env: DistEnv, keep_last: int) -> None:
        self.directory = directory
        self.env = env
        self.keep_last = keep_last

    def existing(self) -> list[Path]:
        """Complete checkpoints, newest first."""
        if not self.directory.is_dir():
            return []
        return sorted(
            (p for p in self.directory.iterdir() if NAME.fullmatch(p.name)), key=step_of, reverse=True
        )

    def save(self, state: TrainingState, config_yaml: str) -> None:
        # Collective: every rank contributes its RNG state, so it must be called on all ranks.
        rng_states = gather_objects(capture_rng_state(), self.env)
        if not self.env.is_main:
            return
        payload = {
            "format": FORMAT_VERSION,
            "world_size": self.env.world_size,
            "config": config_yaml,
            "rng": rng_states,
            **state.state_dict(),
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        for torn in self.directory.glob(".step-*.partial"):  # left by a run killed mid-write
            torn.unlink(missing_ok=True)
        final = self.directory / f"step-{state.progress.step:08d}.pt"
        partial = self.directory / f".{final.name}.partial"
        try:
            with partial.open("wb") as handle:
                torch.save(payload, handle)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            partial.unlink(missing_ok=True)
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CheckpointError(
                    f"{self.directory}: no space left to write the checkpoint of step {state.progress.step}; "
                    "free space there or use an output_dir on a larger volume, then run again to resume "
                    "from the last checkpoint"
                ) from None
            raise
        os.replace(partial, final)
        _fsync_directory(self.directory)
        log.info(f"checkpoint saved: {final}")
        self.retain(final)

    def retain(self, written: Path) -> None:
        """Keep ``checkpoint.keep_last`` checkpoints up to the one just written. Newer ones (left when
        a resume skipped them as unreadable) are never deleted: they may read again, e.g. on NFS."""
        older = [path for path in self.existing() if step_of(path) < step_of(written)]
        for old in older[self.keep_last - 1 :]:
            old.unlink(missing_ok=True)

    def load_latest(self, state: TrainingState, seed: int) -> Resumed | None:
        """Restore the newest checkpoint every rank can read into ``state``; None when there is none.

        Every rank tries rank 0's list of candidates, newest first, and the ranks then compare what they
        read: they resume from the same file, or the run stops. Existing checkpoints that no rank can
        read stop the run too, instead of silently training from step 0 over them.
        """
        candidates = [Path(path) for path in broadcast_object([str(p) for p in self.existing()], self.env)]
        chosen, payload, problems = None, None, []
        for index, candidate in enumerate(candidates):
            try:
                payload = _read(candidate)
            except Exception as error:  # torn, foreign or planted file: try the one before
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
        _restore(path, payload, state, self.env, seed)
        log.info(f"resumed from {path} (step {state.progress.step}, epoch {state.progress.epoch})")
        return Resumed(path, state.progress.step, payload["config"], payload["world_size"])


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
