"""Faults a real cluster produces, under real torchrun with 2 gloo processes: each run must end with the
bitwise same weights as the uninterrupted ``reference`` run.

Interruptions are made deterministic by pausing the workers (SIGSTOP) the moment a checkpoint appears,
so the run cannot finish before the fault lands.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    FAULT_RUN,
    PROJECT,
    QUIET,
    assert_checkpoint_at_stop,
    assert_resumed_from,
    interrupted_run,
    read_metrics,
    run_launch,
)
from process_tree import children, signal_all, wait_for_stop_request
from weights import assert_same_weights

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]


def _kill_job(launch, workers: list[int]) -> None:
    signal_all([launch.pid, *children(launch.pid), *workers], signal.SIGKILL)
    launch.wait()


@pytest.mark.every_type
def test_killed_job_resumes_to_the_same_weights(demo, reference: Path, tmp_path: Path) -> None:
    launch, workers = interrupted_run(demo, tmp_path)
    _kill_job(launch, workers)  # as a lost node or an out-of-memory kill would
    assert not (tmp_path / "final").exists()
    assert (tmp_path / ".lock").exists()  # left behind by the killed rank 0: it must not stand in the way

    resumed = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    steps = [r["step"] for r in read_metrics(tmp_path) if "loss" in r]
    assert steps == sorted(set(steps)), "records of the killed run were lost or duplicated"
    assert steps == [r["step"] for r in read_metrics(reference) if "loss" in r]
    assert_same_weights(reference, tmp_path)


@pytest.mark.parametrize("preemption", [signal.SIGTERM, signal.SIGUSR1])
def test_preempted_job_checkpoints_exits_75_and_resumes(demo, reference, tmp_path, preemption) -> None:
    launch, workers = interrupted_run(demo, tmp_path)
    launch.send_signal(preemption)  # to launch.sh, as SLURM or Kubernetes would
    wait_for_stop_request(launch)  # launch.sh passed it on; the paused workers read it at their next step
    signal_all(workers, signal.SIGCONT)
    _, stderr = launch.communicate(timeout=120)
    assert launch.returncode == 75, stderr[-3000:]
    assert f"stopped by {preemption.name}" in stderr
    assert not (tmp_path / "final").exists()
    checkpoint = assert_checkpoint_at_stop(stderr, tmp_path)

    resumed = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert_resumed_from(checkpoint, resumed.stderr)
    assert_same_weights(reference, tmp_path)


def test_elastic_restart_after_a_worker_dies(demo, reference: Path, tmp_path: Path) -> None:
    launch, workers = interrupted_run(demo, tmp_path, MAX_RESTARTS="1")
    signal_all(workers[1:], signal.SIGKILL)  # one rank dies; torchrun restarts the whole group
    signal_all(workers[:1], signal.SIGCONT)
    _, stderr = launch.communicate(timeout=300)
    assert launch.returncode == 0, stderr[-4000:]
    assert "resumed from" in stderr
    assert_same_weights(reference, tmp_path)


def test_without_restarts_a_dead_worker_ends_the_job_at_once(demo, tmp_path: Path) -> None:
    launch, workers = interrupted_run(demo, tmp_path, MAX_RESTARTS="0")
    signal_all(workers[1:], signal.SIGKILL)
    signal_all(workers[:1], signal.SIGCONT)  # rank 0 now waits for rank 1 in a collective
    started = time.monotonic()
    launch.communicate(timeout=120)
    assert launch.returncode not in (0, 75)
    assert time.monotonic() - started < 60, "the surviving rank hung instead of the job exiting"


def test_a_corrupt_newest_checkpoint_is_skipped(demo, reference: Path, tmp_path: Path) -> None:
    launch, workers = interrupted_run(demo, tmp_path)
    _kill_job(launch, workers)
    checkpoints = tmp_path / "checkpoints"
    newest = sorted(checkpoints.glob("step-*.pt"))[-1]
    torn = checkpoints / "step-99999999.pt"
    torn.write_bytes(newest.read_bytes()[:1000])  # a newest checkpoint cut short
    (checkpoints / ".step-99999998.pt.partial").write_bytes(b"half a write")

    resumed = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"skipping unreadable checkpoint {torn}" in resumed.stderr
    assert f"resumed from {newest}" in resumed.stderr
    assert not list(checkpoints.glob(".*.partial"))
    assert_same_weights(reference, tmp_path)


def test_a_checkpoint_of_another_model_stops_the_job_in_one_line(demo, trained: Path, tmp_path: Path) -> None:
    newest = sorted((trained / "checkpoints").glob("step-*.pt"))[-1]
    payload = torch.load(newest, map_location="cpu", weights_only=False)
    name = next(iter(payload["model"]))
    payload["model"][name] = torch.zeros(3, 1, 7)  # a tensor no model of this project has
    foreign = tmp_path / "checkpoints" / "step-00000001.pt"
    foreign.parent.mkdir()
    torch.save(payload, foreign)
    before = foreign.read_bytes()

    result = run_launch([*demo[1], *QUIET, f"output_dir={tmp_path}"])
    assert result.returncode == 1
    # Every rank meets it; the terminal shows it once, with no traceback and no report of torchrun's.
    assert len(result.stderr.splitlines()) == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {foreign} does not fit this model"), result.stderr
    assert foreign.read_bytes() == before  # untouched


# Rank 1 waits forever before its imports, where no watchdog of the project can see it.
HANG_RANK_1 = """
import os, threading

def wait_forever():
    threading.Event().wait()

if os.environ.get("RANK") == "1":
    wait_forever()
"""


def test_a_hung_run_fails_its_test_with_the_stacks_of_every_process(demo, tmp_path: Path) -> None:
    """A run that hangs in a test ends at the test's timeout with a report that says where each process
    was: the hang of a busy CI machine, which no one can attach a debugger to, is then readable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HANG_RANK_1)
    path = f"{site}{os.pathsep}{PROJECT / 'src'}"
    with pytest.raises(pytest.fail.Exception) as failure:
        run_launch([*demo[1], f"output_dir={tmp_path / 'run'}"], timeout=60, PYTHONPATH=path)
    report = str(failure.value)
    assert "still ran after 60 s" in report
    assert "in wait_forever" in report, report  # rank 1's stack
    assert "Extension modules:" not in report
