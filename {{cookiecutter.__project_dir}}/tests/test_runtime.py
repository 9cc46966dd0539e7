"""The runtime's guards, without torchrun: the output_dir lock, how the launcher turns the workers'
outcomes into lines and an exit code, and processes tied to their parent."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ON_THIS_MACHINE, PROJECT
from process_tree import is_gone

from {{ cookiecutter.package_name }}.launch import launcher, lock
from {{ cookiecutter.package_name }}.launch.lock import (
    Holder,
    OutputDirBusy,
    OutputDirLock,
)
from {{ cookiecutter.package_name }}.launch.status import (
    CRASH,
    FINISHED,
    PREEMPTED,
    USER_ERROR,
    Outcome,
)


@pytest.fixture
def quick_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock's timings, 25 times faster."""
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(lock, "STALE_S", 1.2)
    monkeypatch.setattr(lock, "POLL_S", 0.02)


def place_lock(output_dir: Path, age_s: float = 0.0, **fields: object) -> Path:
    """A lock file as another run would leave it; by default a holder on another machine."""
    output_dir.mkdir(parents=True, exist_ok=True)
    elsewhere = Holder(host="node7", machine="elsewhere", pid=4242, since="then", token="theirs")
    holder = {**asdict(elsewhere), **fields}
    path = output_dir / lock.LOCK_NAME
    path.write_text(json.dumps(holder))
    moment = time.time() - age_s
    os.utime(path, (moment, moment))
    return path


def test_a_live_run_on_this_machine_is_refused_at_once(tmp_path: Path) -> None:
    mine = OutputDirLock(tmp_path)
    mine.acquire()
    try:
        started = time.monotonic()
        with pytest.raises(OutputDirBusy) as refused:
            OutputDirLock(tmp_path).acquire()
        assert time.monotonic() - started < 1
        holder = f"(host {socket.gethostname()}, pid {os.getpid()}, since "
        assert str(refused.value).startswith(f"output_dir={tmp_path} is in use by another run {holder}")
    finally:
        mine.release()
    assert not (tmp_path / lock.LOCK_NAME).exists()


@pytest.mark.parametrize("reaped", [True, False])  # a zombie: killed, its parent has not waited for it
def test_the_lock_of_a_dead_process_on_this_machine_is_taken_at_once(tmp_path: Path, reaped: bool) -> None:
    dead = subprocess.Popen(["sleep", "30"])
    started = lock.process_start(dead.pid)
    dead.kill()
    while not is_gone(dead.pid):
        time.sleep(0.01)
    if reaped:
        dead.wait()
    here = {"host": socket.gethostname(), "machine": lock.this_machine()}
    place_lock(tmp_path, **here, pid=dead.pid, started=started)
    taker = OutputDirLock(tmp_path)
    taker.acquire()  # immediately: no heartbeat to wait for
    assert json.loads((tmp_path / lock.LOCK_NAME).read_text())["token"] == taker.me.token
    taker.release()
    dead.wait()


@contextmanager
def beating(path: Path) -> Iterator[None]:
    """The heartbeat of a live holder on another machine."""
    stopped = threading.Event()

    def heartbeat() -> None:
        while not stopped.wait(0.1):
            os.utime(path)

    thread = threading.Thread(target=heartbeat)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()


def test_a_holder_elsewhere_with_a_heartbeat_is_refused(tmp_path: Path, quick_heartbeat: None) -> None:
    with beating(place_lock(tmp_path)):
        with pytest.raises(OutputDirBusy, match=r"another run \(host node7, pid 4242, since then\)"):
            OutputDirLock(tmp_path).acquire()
        with pytest.raises(OutputDirBusy):
            lock.refuse_if_in_use(tmp_path)  # the pre-check


@pytest.mark.parametrize("age_s", [3600.0, 0.0])  # the clock says abandoned, or cannot tell
def test_a_holder_elsewhere_without_a_heartbeat_is_taken_over(tmp_path, quick_heartbeat, age_s) -> None:
    place_lock(tmp_path, age_s=age_s)
    taker = OutputDirLock(tmp_path)
    taker.acquire()
    assert json.loads((tmp_path / lock.LOCK_NAME).read_text())["token"] == taker.me.token
    assert not list(tmp_path.glob(".lock.*"))  # the abandoned one was removed
    taker.release()


def test_the_same_job_takes_its_lock_back(tmp_path, quick_heartbeat, monkeypatch) -> None:
    """An elastic restart, or a node of a multi-node job coming back: the same torchrun run id."""
    with beating(place_lock(tmp_path, run_id="job-17")):
        with pytest.raises(OutputDirBusy):
            OutputDirLock(tmp_path, run_id="job-18").acquire()
        monkeypatch.setenv(lock.LAUNCH_RUN_ID_ENV, "job-17")
        lock.refuse_if_in_use(tmp_path)  # the pre-check of a node that joins the job lets it pass
        OutputDirLock(tmp_path, run_id="job-17").acquire()


def test_the_pre_check_refuses_a_busy_output_dir(demo, tmp_path: Path, capsys) -> None:
    from {{ cookiecutter.package_name }}.__main__ import main

    mine = OutputDirLock(tmp_path)
    mine.acquire()
    try:
        assert main([*ON_THIS_MACHINE, *demo[1], f"output_dir={tmp_path}", "--check"]) == 1
    finally:
        mine.release()
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: output_dir={tmp_path} is in use by another run (host ")


def test_the_heartbeat_moves_the_lock_files_mtime(tmp_path: Path, quick_heartbeat: None) -> None:
    mine = OutputDirLock(tmp_path)
    mine.acquire()
    path = tmp_path / lock.LOCK_NAME
    os.utime(path, (0, 0))
    deadline = time.monotonic() + 30
    while path.stat().st_mtime == 0:
        assert time.monotonic() < deadline, "no heartbeat"
        time.sleep(0.02)
    mine.release()


def outcome(kind: str, rank: int, message: str = "", attempt: int = 0, at: float = 0.0) -> Outcome:
    return Outcome(kind=kind, message=message, rank=rank, attempt=attempt, pid=pid(rank, attempt), time=at)


def pid(rank: int, attempt: int = 0) -> int:
    return 1000 + 100 * attempt + rank


def failure(*ranks: int, attempt: int = 0, killed: int | None = None) -> Exception:
    """torchrun's ChildFailedError, as far as the launcher reads it: the failed ranks' processes."""
    error = RuntimeError("a report of 40 lines")
    error.failures = {  # type: ignore[attr-defined]
        rank: SimpleNamespace(
            pid=pid(rank, attempt), exitcode=-9 if rank == killed else 1, signal_name=lambda: "SIGKILL"
        )
        for rank in ranks
    }
    return error


def never() -> Path:
    raise AssertionError("no log file expected")


def test_each_user_error_is_shown_once(capsys: pytest.CaptureFixture[str]) -> None:
    this_attempt = [
        outcome(USER_ERROR, 0, "error: a.jsonl:3: missing field 'label'"),
        outcome(USER_ERROR, 1, "error: a.jsonl:3: missing field 'label'"),
        outcome(USER_ERROR, 2, "error: b.jsonl:1: not valid JSON"),
        outcome(CRASH, 3, "RuntimeError: Connection closed by peer"),  # waited for the others
    ]
    outcomes = [outcome(USER_ERROR, 0, "error: from the attempt before", attempt=0)]
    outcomes += [replace(item, attempt=1, pid=pid(item.rank, 1)) for item in this_attempt]
    assert launcher.conclude(outcomes, failure(0, 1, 2, 3, attempt=1), never) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: a.jsonl:3: missing field 'label'",
        "error: b.jsonl:1: not valid JSON",
    ]


def test_a_preempted_group_exits_75_and_a_finished_one_0(capsys: pytest.CaptureFixture[str]) -> None:
    stop = "stopped by SIGTERM after step 8; checkpoint saved; run the same command to resume"
    assert launcher.conclude([outcome(PREEMPTED, 0, stop), outcome(PREEMPTED, 1, stop)], None, never) == 75
    assert capsys.readouterr().err.splitlines() == [f"launch.sh: {stop}"]
    # A restart that finished after an earlier attempt's stop: finished.
    later = [outcome(PREEMPTED, 0, stop), outcome(FINISHED, 0, attempt=1)]
    assert launcher.conclude(later, None, never) == 0


def test_a_bug_or_a_killed_worker_is_one_line_with_the_log(capsys, tmp_path: Path) -> None:
    log = tmp_path / "failure.log"
    crashes = [outcome(CRASH, 0, "RuntimeError: gone", at=2.0), outcome(CRASH, 1, "KeyError: 'x'", at=1.0)]
    assert launcher.conclude(crashes, failure(0, 1), lambda: log) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: rank 1 failed with KeyError: 'x'; the traceback is in {log}"  # the first to fail
    ]
    # A worker killed without a word is the cause; the other's crash followed from it.
    assert launcher.conclude(crashes[:1], failure(0, 1, killed=1), lambda: log) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: rank 1 (pid 1001) was killed by SIGKILL; torchrun's report is in {log}"
    ]


TIED_CHILD = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from {{ cookiecutter.package_name }}.launch.lifeline import tie_to_parent
tie_to_parent()
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_process_tied_to_its_parent_ends_with_it(tmp_path: Path) -> None:
    # The parent starts the child in a session of its own, as torchrun starts its workers.
    parent_code = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {TIED_CHILD!r}, {str(PROJECT / 'src')!r}],"
        " start_new_session=True, stdout=sys.stdout)\n"
        "child.wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()  # SIGKILL: no chance to clean up
    parent.wait()
    deadline = time.monotonic() + 30
    while not is_gone(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.02)
