"""Console, ``metrics.jsonl`` and tracker output, written by global rank 0 only."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from .config import LogLevel
from .distributed import DistEnv
from .trackers import NoTracker, Tracker, is_evaluation

log = logging.getLogger(__package__)


def setup_logging(env: DistEnv, level: LogLevel = LogLevel.info) -> None:
    """Rank 0 logs at ``level``; the other ranks only warnings and errors, tagged with their rank."""
    handler = logging.StreamHandler(sys.stderr)
    tag = "" if env.is_main else f"[rank {env.rank}] "
    handler.setFormatter(logging.Formatter(f"%(asctime)s {tag}%(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(getattr(logging, level.value.upper()) if env.is_main else logging.WARNING)
    log.propagate = False


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
