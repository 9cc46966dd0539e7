"""The process tree of a ``launch.sh`` run: launch.sh -> its launcher (torchrun) -> the workers, read from
/proc, and waiting for what the tests of signals and faults wait on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # already gone
        return []


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children, whichever of its threads started them."""
    try:
        threads = [task.name for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:  # already gone
        return []
    below: list[int] = []
    for thread in threads:
        with contextlib.suppress(OSError):
            for child in Path(f"/proc/{pid}/task/{thread}/children").read_text().split():
                below += [int(child), *descendants(int(child))]
    return below


def workers_of(launch: subprocess.Popen) -> list[int]:
    """The training processes: launch.sh -> torchrun -> workers."""
    return [worker for torchrun in children(launch.pid) for worker in children(torchrun)]


def is_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie that only waits to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def launcher_of(launch: subprocess.Popen) -> int:
    """launch.sh's child that runs torchrun (launch.sh has others for a moment, when it handles a signal)."""
    for pid in children(launch.pid):
        with contextlib.suppress(OSError):
            if b".launcher" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("launch.sh runs no launcher")


def threads_taking(pid: int, numbers: list[int]) -> list[int]:
    """The threads of process ``pid`` that would run a handler of one of the signals ``numbers``: those
    that do not block them all, less one that waits for them in sigwait (which lifts the block while it
    waits, and takes the signal without a handler)."""
    mask = sum(1 << (number - 1) for number in numbers)
    taking = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        lines = (task / "status").read_text().splitlines()
        blocked = int(next(line for line in lines if line.startswith("SigBlk:")).split()[1], 16)
        if blocked & mask != mask and "sigtimedwait" not in (task / "wchan").read_text():
            taking.append(int(task.name))
    return taking


def wait_for_stop_request(launch: subprocess.Popen, timeout: float = 60) -> None:
    """Until launch.sh has asked its workers to stop (launch/status.py), which it does when signalled."""
    variables = Path(f"/proc/{launcher_of(launch)}/environ").read_text().split("\0")
    environ = dict(item.split("=", 1) for item in variables if "=" in item)
    stop_file = Path(environ["LAUNCH_STATUS_DIR"]) / "stop"
    deadline = time.monotonic() + timeout
    while not stop_file.exists():
        assert time.monotonic() < deadline, "launch.sh did not pass the signal on"
        time.sleep(0.01)


def wait_for_checkpoint(output_dir: Path, launch: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not list((output_dir / "checkpoints").glob("step-*.pt")):
        assert launch.poll() is None, f"the run ended early: {launch.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)


def signal_all(pids: list[int], number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


def abort_with_stacks(launch: subprocess.Popen) -> str:
    """SIGABRT to every process of the run, deepest first: Python's fault handler (PYTHONFAULTHANDLER)
    writes each one's threads to stderr before it ends. Returns the run's stderr, less the fault handler's
    list of extension modules and the import machinery's frames."""
    processes = descendants(launch.pid)
    for pid in reversed(processes):
        signal_all([pid], signal.SIGABRT)
        time.sleep(0.5)  # one process's stacks at a time, not interleaved
    signal_all([launch.pid, *processes], signal.SIGKILL)
    stderr = launch.communicate(timeout=60)[1]
    noise = ("Extension modules:", '  File "<frozen importlib')
    return "\n".join(line for line in stderr.splitlines() if not line.startswith(noise))
