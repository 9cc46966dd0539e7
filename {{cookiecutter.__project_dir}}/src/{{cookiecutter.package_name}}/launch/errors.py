"""How a run's errors reach the user: one line per problem, shown once, whatever the number of processes.

A user error (configuration, data, checkpoint, model id, paths, a full disk) is its message and nothing
else. Under launch.sh no worker prints it: each worker that meets it tells the launcher
(launch/status.py), which shows each distinct message once after the node's last worker ended; a bug's
traceback goes the same way into a log file under output_dir, and the terminal gets its path. Run
alone, a process prints its error itself and a bug's traceback is Python's.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback

from .status import CRASH, USER_ERROR, tell_launcher

# Operating-system errors that are the machine's state, not a bug: what to say, and the fix.
USER_OS_ERRORS = {
    errno.ENOSPC: ("no space left on the device", "free some space or choose another output_dir"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or choose another output_dir"),
    errno.EROFS: ("read-only file system", "choose a writable output_dir"),
    errno.EACCES: ("permission denied", "fix the permissions or choose another path"),
}


def os_error_message(error: BaseException) -> str | None:
    """One line for a full disk or a path the run may not write; None for any other error."""
    if not isinstance(error, OSError) or error.errno not in USER_OS_ERRORS:
        return None
    problem, fix = USER_OS_ERRORS[error.errno]
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{problem}; {fix}"


def report_error(message: str) -> None:
    """A user error's line: to the launcher under launch.sh, else printed (other ranks tagged)."""
    if tell_launcher(USER_ERROR, message):
        return
    rank = int(os.environ.get("RANK", "0"))
    print(f"[rank {rank}] {message}" if rank else message, file=sys.stderr, flush=True)


def report_crash(error: BaseException) -> bool:
    """Hand a bug's traceback to the launcher; False when there is none and the caller should re-raise."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    summary = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
    detail = "".join(traceback.format_exception(error))
    return tell_launcher(CRASH, summary, detail)
