"""How the workers of a node and launch.sh talk: files in a folder launch.sh makes for each run.

launch.sh hands the folder to its launcher in ``LAUNCH_STATUS_DIR``; torchrun passes it on to the workers.

- ``stop``: launch.sh writes it when it receives SIGTERM, SIGINT or SIGUSR1, and so does the launcher when
  the signal comes to the whole job. The workers look for it at every step, as they look at their own
  signal flag, so a signal that reaches launch.sh before the workers exist, or while they are paused, is
  not lost.
- ``<attempt>-<rank>.json``: every worker writes one when it ends: finished, preempted (after the
  checkpoint), a user error (its one-line message) or a crash (its traceback), with its pid.

The launcher reads the files once the last worker of its node has exited, and prints what they say. Only
the launcher prints, and only after every worker ended: that order, not timing, is why each problem is
shown once. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..parallel.environment import launched_by_torchrun

STATUS_DIR_ENV = "LAUNCH_STATUS_DIR"
STOP_FILE = "stop"
FINISHED, PREEMPTED, USER_ERROR, CRASH = "finished", "preempted", "user_error", "crash"
# What ``python -m <package>`` returns after a preemption when it runs alone (EX_TEMPFAIL: "try again").
# Under torchrun the workers return 0, so torchrun neither restarts them nor reports a failure;
# launch.sh returns this code instead.
PREEMPTED_EXIT_CODE = 75


@dataclass(frozen=True)
class Outcome:
    kind: str  # FINISHED, PREEMPTED, USER_ERROR or CRASH
    message: str  # the line to show (empty when finished)
    rank: int
    attempt: int  # torchrun's restart count: 0 for the first group
    pid: int
    time: float
    detail: str = ""  # a crash's traceback


def status_dir() -> Path | None:
    """The folder of a worker under launch.sh; None for a process run alone or under a torchrun of yours."""
    value = os.environ.get(STATUS_DIR_ENV)
    return Path(value) if value and launched_by_torchrun() else None


def tell_launcher(kind: str, message: str = "", detail: str = "") -> bool:
    """Leave this worker's outcome for the launcher; False when there is no launcher to tell."""
    directory = status_dir()
    if directory is None:
        return False
    outcome = Outcome(
        kind=kind,
        message=message,
        rank=int(os.environ.get("RANK", "0")),
        attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        pid=os.getpid(),
        time=time.time(),
        detail=detail,
    )
    final = outcome_path(directory, outcome.attempt, outcome.rank)
    partial = directory / f".{final.name}.{outcome.pid}"
    try:
        partial.write_text(json.dumps(asdict(outcome)), encoding="utf-8")
        os.replace(partial, final)  # the launcher never reads half a file
    except OSError:  # launch.sh is gone, and its folder with it: say it here instead
        return False
    return True


def outcome_path(directory: Path, attempt: int, rank: int) -> Path:
    return directory / f"{attempt}-{rank}.json"


def read_outcomes(directory: Path) -> list[Outcome]:
    """Every worker's outcome, in (attempt, rank) order."""
    outcomes = [Outcome(**json.loads(path.read_text(encoding="utf-8"))) for path in directory.glob("*.json")]
    return sorted(outcomes, key=lambda outcome: (outcome.attempt, outcome.rank))


def request_stop(directory: Path, signal_name: str) -> None:
    """Ask the workers to stop, naming the signal (e.g. ``SIGINT``), in one rename as launch.sh does."""
    partial = directory / f".{STOP_FILE}.{os.getpid()}"
    partial.write_text(f"{signal_name}\n", encoding="utf-8")
    os.replace(partial, directory / STOP_FILE)


def stop_requested() -> str | None:
    """The signal launch.sh received (e.g. ``SIGTERM``), once it asked the workers to stop."""
    directory = status_dir()
    if directory is None:
        return None
    try:
        return (directory / STOP_FILE).read_text(encoding="utf-8").strip() or "a stop request"
    except FileNotFoundError:
        return None
