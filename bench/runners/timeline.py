"""The timeline each runner reports to the bench: when every optimizer step and evaluation ended."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Timeline:
    """Wall-clock times of every optimizer step and evaluation; rank 0 writes them for the bench."""

    def __init__(self, spec: dict[str, Any], steps_per_epoch: int = 0) -> None:
        self.path = Path(spec["timeline"])
        self.eval_every = spec["eval_every_steps"]
        self.steps_per_epoch = steps_per_epoch
        self.steps: list[tuple[int, float]] = []
        self.evals: list[dict[str, Any]] = []
        self.eval_started = 0.0

    def step_done(self, step: int, evaluate: Callable[[], dict[str, float]] | None = None) -> None:
        """Record the end of ``step``; then ``evaluate``, outside the step's time, where the generated
        project's schedule does: at the end of each epoch, and every ``eval_every_steps`` if set."""
        self.steps.append((step, time.time()))
        epoch_end = self.steps_per_epoch and step % self.steps_per_epoch == 0
        if evaluate is not None and (epoch_end or (self.eval_every and step % self.eval_every == 0)):
            self.eval_start()
            self.eval_done(step, evaluate())

    def eval_start(self) -> None:
        self.eval_started = time.time()

    def eval_done(self, step: int, metrics: dict[str, float]) -> None:
        self.evals.append({"step": step, "start": self.eval_started, "end": time.time(), **metrics})

    def write(self) -> None:
        if int(os.environ.get("RANK", "0")) == 0:
            self.path.write_text(json.dumps({"steps": self.steps, "evals": self.evals}))
