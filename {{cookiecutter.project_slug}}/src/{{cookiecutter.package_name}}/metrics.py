"""Console and ``metrics.jsonl`` output, written by global rank 0 only."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from .distributed import DistEnv

log = logging.getLogger(__package__)


def setup_logging(env: DistEnv) -> None:
    """Rank 0 logs progress; the other ranks only warnings and errors, tagged with their rank."""
    handler = logging.StreamHandler(sys.stderr)
    tag = "" if env.is_main else f"[rank {env.rank}] "
    handler.setFormatter(logging.Formatter(f"%(asctime)s {tag}%(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if env.is_main else logging.WARNING)
    log.propagate = False


class MetricsWriter:
    """Appends one JSON object per line; a resumed run keeps the records up to its checkpoint."""

    def __init__(self, output_dir: Path, env: DistEnv) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.enabled = env.is_main

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
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        shown = " ".join(f"{key}={_short(value)}" for key, value in record.items())
        log.info(shown)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
