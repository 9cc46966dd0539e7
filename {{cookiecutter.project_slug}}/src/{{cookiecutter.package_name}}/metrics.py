"""``metrics.jsonl`` and the tracker, fed by global rank 0 only, and the console line of each record."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .distributed import DistEnv
from .log import log
from .trackers import NoTracker, Tracker, is_evaluation


class MetricsWriter:
    """Appends one JSON object per line and hands the same record to the tracker.

    A resumed run keeps the records up to its checkpoint.
    """

    def __init__(self, output_dir: Path, env: DistEnv, tracker: Tracker | None = None) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.enabled = env.is_main
        self.tracker = tracker or NoTracker()

    def resume_from(self, step: int) -> None:
        """Drop records a killed run wrote after its last checkpoint: they are about to be redone."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:  # a line torn by the kill
                continue
        self.path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """The record, with the wall-clock ``time`` (Unix seconds) it was written at."""
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
        self.tracker.log(record)
        kind = "eval" if is_evaluation(record) else "train"
        log.info(f"{kind:<5} " + " ".join(f"{key}={_short(value)}" for key, value in record.items()))

    def close(self, outcome: str) -> None:
        """``outcome``: finished, preempted or failed; the tracker records it."""
        self.tracker.close(outcome)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
