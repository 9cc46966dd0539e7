"""``checkpoint.every_minutes``: lost work bounded in time as well as in steps.

Each rank keeps its own clock and votes with the preemption vote (launch/preemption.py), whose agreement
every rank reads after the same step: the first rank whose clock says "due" decides for all, and no rank
waits for another's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class CheckpointClock:
    def __init__(self, every_minutes: float, now: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.now = every_minutes * 60, now
        self.last_save = now()
        self.saved_step = -1

    def due(self) -> bool:
        """This rank's vote: the interval has passed since the last checkpoint (of any cadence)."""
        return self.every_s > 0 and self.now() - self.last_save >= self.every_s

    def saved(self, step: int) -> None:
        self.last_save, self.saved_step = self.now(), step
