"""Preemption: stop at a step boundary that every rank agrees on, after one checkpoint.

SIGTERM (a cancelled job, a Kubernetes eviction), SIGUSR1 (SLURM's warning before the time limit, see
``#SBATCH --signal``) and SIGINT (Ctrl-C) only set a flag, as does launch.sh's stop request
(launch/status.py), which reaches the workers however the signal was delivered. After each optimizer
step the ranks OR their flags together, so they all stop after the same step even though the signal
reaches them at different moments; then they save one checkpoint and exit. Running the same command
again resumes from it. The vote of one step travels while the next step computes and is read after it:
the stop comes one step later, and no step waits.

The same vote carries each rank's "a checkpoint is due" (``checkpoint.every_minutes``, by its own clock),
so the ranks also agree on the step of a timed checkpoint without a collective of its own.
"""

from __future__ import annotations

import signal
from types import FrameType

import torch

from ..parallel.process_group import start_all_reduce_max_cpu, wait_for
from .status import stop_requested

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class Preempted(Exception):
    """Raised on every rank after the preemption checkpoint is written."""

    def __init__(self, signal_name: str, step: int) -> None:
        super().__init__(f"stopped by {signal_name} after step {step}; checkpoint saved")
        self.signal_name, self.step = signal_name, step


class PreemptionWatch:
    """Installed before start-up, so a signal that arrives while loading is not lost."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.vote = torch.zeros(2, dtype=torch.int32)  # [stop, checkpoint due]
        self.checkpoint_due = False  # the ranks' agreement, as of the last agreed()
        self.vote_in_flight: torch.distributed.Work | None = None
        for number in SIGNALS:
            signal.signal(number, self._record)
        # launch.sh's launcher starts the workers with these signals blocked; one that came before the
        # handlers were in place is delivered now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)

    def _record(self, number: int, frame: FrameType | None) -> None:
        if self.received and number == signal.SIGINT:  # a second Ctrl-C: stop now, without a checkpoint
            raise KeyboardInterrupt
        self.received = signal.Signals(number).name

    def agreed(self, checkpoint_due: bool = False) -> bool:
        """True on every rank, at the same step, once a rank received a signal before the previous call.

        `checkpoint_due` is this rank's vote for a timed checkpoint; ``self.checkpoint_due`` then says,
        equally on every rank, whether some rank voted so at the previous call.
        A collective: call it on all ranks after every step, and ``settle()`` once the loop ends.
        """
        wait_for(self.vote_in_flight)  # sent a step ago: long done
        self.vote_in_flight = None
        decided, self.checkpoint_due = bool(self.vote[0].item()), bool(self.vote[1].item())
        if not decided:
            self.received = self.received or stop_requested()
            # A checkpoint agreed on now is saved before the next vote: no rank asks for it again.
            due = checkpoint_due and not self.checkpoint_due
            self.vote = torch.tensor([1 if self.received else 0, int(due)], dtype=torch.int32)
            self.vote_in_flight = start_all_reduce_max_cpu(self.vote)
        return decided

    def settle(self) -> None:
        """Wait for the vote still travelling, so no collective outlives the loop."""
        wait_for(self.vote_in_flight)
        self.vote_in_flight = None

    def signal_name(self) -> str:
        # A rank that learnt of the stop by the vote still names launch.sh's signal where there is one.
        return self.received or stop_requested() or "a signal on another rank"
