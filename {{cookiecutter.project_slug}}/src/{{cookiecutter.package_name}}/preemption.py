"""Preemption: stop at a step boundary that every rank agrees on, after one checkpoint.

SIGTERM (a cancelled job, a Kubernetes eviction) and SIGUSR1 (SLURM's warning before the time limit, see
``#SBATCH --signal``) only set a flag. At each optimizer step the ranks OR their flags together, so they
all stop after the same step even though the signal reaches them at different moments; then they save
one checkpoint and exit. Running the same command again resumes from it.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch

from .distributed import all_reduce_max_cpu

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# What ``python -m <package>`` returns after a preemption when it runs alone (EX_TEMPFAIL: "try again").
# Under torchrun the workers return 0, so torchrun neither restarts them nor reports a failure;
# launch.sh returns this code instead.
PREEMPTED_EXIT_CODE = 75


class Preempted(Exception):
    """Raised on every rank after the preemption checkpoint is written."""

    def __init__(self, signal_name: str, step: int) -> None:
        super().__init__(f"stopped by {signal_name} after step {step}; checkpoint saved")
        self.signal_name, self.step = signal_name, step


class PreemptionWatch:
    """Installed before start-up, so a signal that arrives while loading is not lost."""

    def __init__(self) -> None:
        self.received: str | None = None
        for number in SIGNALS:
            signal.signal(number, self._record)

    def _record(self, number: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(number).name

    def agreed(self) -> bool:
        """True on every rank as soon as any rank received a signal. A collective: call it on all ranks."""
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32)
        return bool(all_reduce_max_cpu(flag).item())

    def signal_name(self) -> str:
        return self.received or "a signal on another rank"
