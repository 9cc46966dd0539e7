"""Where a run's wall time goes outside its steps: the start-up and shut-down phases, each timed where it
ends and logged by rank 0 in one line when the run finishes. A short job is mostly these phases, so the
line says what a user pays per launch, and the bench holds each phase to account.

The clock starts when this process started (not when this module was imported), and the launcher's
share is the time from ``launch.sh``'s start (``LAUNCH_STARTED``) to this process's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LAUNCH_STARTED_ENV = "LAUNCH_STARTED"  # Unix time launch.sh started, exported by it
TRAINING = "training"  # the phase between start-up and shut-down: steps, evaluations, checkpoints


def process_started() -> float:
    """Unix time this process started: from its start in clock ticks since boot (Linux), else now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def launch_started() -> float | None:
    try:
        return float(os.environ[LAUNCH_STARTED_ENV])
    except (KeyError, ValueError):
        return None


class PhaseClock:
    def __init__(self, started: float, launched: float | None = None) -> None:
        self.last = started
        self.launcher_s = started - launched if launched is not None and launched <= started else None
        self.spans: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        """``phase`` ended now; it began where the previous one ended."""
        now = time.time()
        self.spans.append((phase, now - self.last))
        self.last = now

    def summary(self) -> str:
        """One line: the launcher, the start-up phases, training, and the shut-down phases, in seconds."""
        names = [name for name, _ in self.spans]
        cut = names.index(TRAINING) if TRAINING in names else len(names)
        parts = [] if self.launcher_s is None else [f"launcher {self.launcher_s:.2f} s"]
        parts.append(_group("start-up", self.spans[:cut]))
        if cut < len(names):
            parts.append(f"{TRAINING} {self.spans[cut][1]:.2f} s")
            parts.append(_group("end", self.spans[cut + 1 :]))
        return "wall time: " + "; ".join(parts)


def _group(title: str, spans: list[tuple[str, float]]) -> str:
    total = sum(seconds for _, seconds in spans)
    return f"{title} {total:.2f} s (" + ", ".join(f"{name} {seconds:.2f}" for name, seconds in spans) + ")"


phases = PhaseClock(process_started(), launch_started())
