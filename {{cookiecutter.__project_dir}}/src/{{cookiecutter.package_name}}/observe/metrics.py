"""``metrics.jsonl`` and the tracker, fed by global rank 0 only, and the console line of each record."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ..parallel import liveness
from ..parallel.process_group import DistEnv
from .log import log
from .trackers import NoTracker, Tracker, is_evaluation


def json_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) of every whole JSON object in a JSON Lines file; a line torn by a kill is left out."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            found.append((line, record))
    return found


def keep_up_to(path: Path, step: int) -> None:
    """Drop the records a killed run wrote after its last checkpoint (and torn lines): they are redone."""
    if path.exists():
        kept = [line for line, record in json_lines(path) if record.get("step", 0) <= step]
        path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")


class MetricsWriter:
    """Appends one JSON object per line and hands the same record to the tracker.

    A resumed run keeps the records up to its checkpoint. The file stays strict JSON: a value that is
    not a finite number is written as null.
    """

    def __init__(
        self, output_dir: Path, env: DistEnv, tracker: Tracker | None = None, enabled: bool = True
    ) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.is_main = env.is_main
        self.enabled = enabled and env.is_main
        self.tracker = tracker or NoTracker()

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        """(line, record) of every whole record in the file, on rank 0; a line torn by a kill is left out."""
        return json_lines(self.path) if self.is_main else []

    def evaluation_at(self, step: int) -> dict[str, Any]:
        """The evaluation record of ``step`` (without its time), if the file holds one; else empty."""
        for _, record in reversed(self.records()):
            if is_evaluation(record) and record.get("step") == step:
                return {key: value for key, value in record.items() if key != "time"}
        return {}

    def resume_from(self, step: int) -> dict[str, Any]:
        """Drop records a killed run wrote after its last checkpoint: they are about to be redone.
        Returns the evaluation record of ``step`` itself, if the file holds one (else empty)."""
        if not self.enabled:
            return {}
        keep_up_to(self.path, step)
        return self.evaluation_at(step)

    def write(self, record: dict[str, Any]) -> None:
        """The record, with the wall-clock ``time`` (Unix seconds) it was written at."""
        if not self.enabled:
            return
        liveness.ensure_not_cut_off()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            line = {
                key: _finite_or_none(value)
                for key, value in {**record, "time": round(time.time(), 3)}.items()
            }
            handle.write(json.dumps(line, allow_nan=False) + "\n")
        self.tracker.log(record)
        kind = "eval" if is_evaluation(record) else "train"
        log.info(f"{kind:<5} " + " ".join(f"{key}={_short(value)}" for key, value in record.items()))

    def close(self, outcome: str) -> None:
        """``outcome``: finished, preempted or failed; the tracker records it."""
        self.tracker.close(outcome)


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
