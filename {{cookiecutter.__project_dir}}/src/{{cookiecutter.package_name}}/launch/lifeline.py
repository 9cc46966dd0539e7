"""No process of a job outlives the one that started it: a worker ends with its torchrun, and the launcher
with launch.sh.

torchrun starts every worker in a session of its own, so a ``kill -9`` of torchrun (the out-of-memory
killer, a CI timeout) or of launch.sh's process group leaves the workers running as orphans, training and
writing checkpoints into an output_dir that the next run wants. Two guards end them within a second or
two, as if they had been killed with the job; the next run resumes from the newest checkpoint:

- Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): the kernel kills the process the
  moment its parent thread ends. torchrun starts its workers from its main thread, whose end is its own.
- A watchdog thread that compares ``getppid()`` with the parent's pid every second, for kernels without
  prctl, and for a parent that died before the prctl call.

Nothing here imports torch: the worker ties itself before its slow imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

# The pid a worker's parent must have: the launcher exports its own, so a worker whose launcher died
# before the worker could look knows it. Without it (a torchrun of your own) the parent at start counts.
PARENT_PID_ENV = "LAUNCH_PARENT_PID"
PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
WATCH_INTERVAL_S = 1.0


def tie_to_parent(expected_parent: int | None = None) -> None:
    """End this process (SIGKILL) when its parent ends."""
    parent = expected_parent or os.getppid()
    _set_parent_death_signal()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(parent,), name="lifeline", daemon=True).start()


def expected_parent() -> int | None:
    raw = os.environ.get(PARENT_PID_ENV, "")
    return int(raw) if raw.isdigit() else None


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the watchdog alone serves
        pass


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def exit_at_once(code: int) -> None:
    """End this process now that its work is done and reported: output flushed, logs closed, then out
    without the interpreter's teardown. For a worker, gloo's threads can be torn down in the wrong order
    at exit ("terminate called without an active exception"), which turned a finished run's exit code 0
    into a crash report on a busy machine; for the launcher, tearing down torch's modules took 0.5 s of
    every launch's wall time, and neither holds anything left to keep."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
