"""Stopping and sharing a job, under real torchrun with 2 gloo processes: however the job is stopped it
ends the same way (a checkpoint, exit 75 on every node, or no process left behind), and one output_dir
holds one run at a time."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    FAULT_RUN,
    ON_THIS_MACHINE,
    PACKAGE,
    QUIET,
    assert_checkpoint_at_stop,
    assert_resumed_from,
    free_port,
    interrupted_run,
    launch_env,
    read_metrics,
    run_launch,
    start_launch,
)
from process_tree import (
    children,
    is_gone,
    launcher_of,
    signal_all,
    threads_taking,
    wait_for_checkpoint,
    wait_for_stop_request,
    workers_of,
)
from weights import assert_same_weights

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]

STOPPED = re.compile(
    r"launch\.sh: stopped by (SIG\w+|a signal on another rank) after step \d+; checkpoint saved; run the same"
)


def busy(output_dir: Path, holder_pid: int) -> re.Pattern:
    return re.compile(
        rf"error: output_dir={re.escape(str(output_dir))} is in use by another run "
        rf"\(host {re.escape(socket.gethostname())}, pid {holder_pid}, since [^)]+\); wait for it to end"
    )


def test_a_second_run_into_a_busy_output_dir_is_refused_in_seconds(demo, tmp_path: Path, reap) -> None:
    first, workers = interrupted_run(demo, tmp_path)  # paused: it cannot end before the second starts
    reap += [first.pid, *workers]
    started = time.monotonic()
    second = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"], timeout=120)
    assert second.returncode == 1
    assert time.monotonic() - started < 30  # the pre-check refuses it; no torchrun starts
    [line] = second.stderr.splitlines()
    assert busy(tmp_path, workers[0]).match(line), line  # rank 0 holds the lock

    signal_all(workers, signal.SIGCONT)
    _, stderr = first.communicate(timeout=240)
    assert first.returncode == 0, stderr[-3000:]
    records = [(r["step"], "eval_loss" in r) for r in read_metrics(tmp_path)]
    assert len(records) == len(set(records))
    assert not (tmp_path / ".lock").exists()  # released at the end


def test_two_runs_started_together_into_one_output_dir(demo, tmp_path: Path, reap) -> None:
    runs = [start_launch([*demo[1], *QUIET, "train.epochs=50", f"output_dir={tmp_path}"]) for _ in range(2)]
    reap += [run.pid for run in runs]
    deadline = time.monotonic() + 240
    while all(run.poll() is None for run in runs):  # one is refused while the other trains
        assert time.monotonic() < deadline, "neither run was refused"
        time.sleep(0.05)
    [refused] = [run for run in runs if run.poll() is not None]
    [winner] = [run for run in runs if run is not refused]
    _, stderr = refused.communicate()
    assert refused.returncode == 1
    [line] = stderr.splitlines()
    assert busy(tmp_path, int(line.split("pid ")[1].split(",")[0])).match(line), line

    winner.send_signal(signal.SIGTERM)  # enough: it trains alone
    _, stderr = winner.communicate(timeout=240)
    assert winner.returncode == 75, stderr[-3000:]
    records = [(r["step"], "eval_loss" in r) for r in read_metrics(tmp_path)]
    assert len(records) == len(set(records))


@pytest.mark.parametrize("killed", ["torchrun", "the process group of launch.sh"])
def test_workers_end_with_their_torchrun(demo, tmp_path: Path, killed: str, reap) -> None:
    """torchrun starts each worker in a session of its own: a kill -9 of torchrun or of launch.sh's group
    must still end them (the out-of-memory killer, a CI timeout), so they stop writing into output_dir."""
    launch = start_launch([*demo[1], *QUIET, "train.epochs=50", f"output_dir={tmp_path}"])
    wait_for_checkpoint(tmp_path, launch)
    workers = workers_of(launch)
    reap += [launch.pid, *workers]
    assert len(workers) == 2
    if killed == "torchrun":
        signal_all([launcher_of(launch)], signal.SIGKILL)
    else:
        os.killpg(launch.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not all(is_gone(worker) for worker in workers):
        assert time.monotonic() < deadline, "the workers outlived their torchrun"
        time.sleep(0.05)
    launch.communicate(timeout=60)


@pytest.mark.parametrize(
    ("signalled", "number"),
    [
        ("every process", signal.SIGTERM),  # scancel; SIGUSR1: SLURM's --signal without B:
        ("every process", signal.SIGUSR1),
        ("the process group", signal.SIGTERM),  # kill -- -PGID: launch.sh and torchrun, not the workers
    ],
    ids=["SIGTERM to every process", "SIGUSR1 to every process", "SIGTERM to the process group"],
)
def test_a_signal_to_the_whole_job_stops_after_a_checkpoint(
    demo, reference, tmp_path, signalled, number, reap
):
    launch, workers = interrupted_run(demo, tmp_path, *QUIET)
    reap += [launch.pid, *workers]
    if signalled == "every process":
        signal_all([launch.pid, *children(launch.pid), *workers], number)
    else:
        os.killpg(launch.pid, number)
        wait_for_stop_request(launch)
    signal_all(workers, signal.SIGCONT)
    _, stderr = launch.communicate(timeout=120)
    assert launch.returncode == 75, stderr[-3000:]  # torchrun survived it and saw clean workers
    [line] = stderr.splitlines()
    assert STOPPED.match(line) and number.name in line, line
    checkpoint = assert_checkpoint_at_stop(line, tmp_path)

    resumed = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert_resumed_from(checkpoint, resumed.stderr)
    assert_same_weights(reference, tmp_path)


def test_ctrl_c_stops_after_a_checkpoint_in_one_line(demo, reference: Path, tmp_path: Path, reap) -> None:
    """Ctrl-C: the terminal sends SIGINT to its foreground process group, launch.sh and torchrun."""
    launch, workers = interrupted_run(demo, tmp_path, *QUIET)
    reap += [launch.pid, *workers]
    stop_signals = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1]
    assert threads_taking(launcher_of(launch), stop_signals) == []  # so torchrun's handlers never run
    os.killpg(launch.pid, signal.SIGINT)
    wait_for_stop_request(launch)
    signal_all(workers, signal.SIGCONT)
    _, stderr = launch.communicate(timeout=120)
    assert launch.returncode == 75
    assert STOPPED.match(stderr) and stderr.count("\n") == 1, stderr[-3000:]  # no tracebacks, no reports
    checkpoint = assert_checkpoint_at_stop(stderr, tmp_path)

    resumed = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert_resumed_from(checkpoint, resumed.stderr)
    assert_same_weights(reference, tmp_path)


def test_preempting_one_node_stops_every_node_with_75(demo, tmp_path: Path, reap) -> None:
    """Kubernetes evicts one pod: only that node's launch.sh gets SIGTERM. Every node must exit 75, or a
    node's 0 marks the job done (a PyTorchJob's Master) while it has no final/."""
    port = free_port()
    rendezvous = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RUN_ID": f"r{port}"}
    run = [*demo[1], *FAULT_RUN, *QUIET, f"output_dir={tmp_path}"]
    nodes = [start_launch(run, nproc=1, NODE_RANK=rank, **rendezvous) for rank in ("1", "0")]
    reap += [node.pid for node in nodes]
    wait_for_checkpoint(tmp_path, nodes[0])
    workers = [worker for node in nodes for worker in workers_of(node)]
    reap += workers
    signal_all(workers, signal.SIGSTOP)
    nodes[0].send_signal(signal.SIGTERM)  # node 1 alone
    wait_for_stop_request(nodes[0])
    signal_all(workers, signal.SIGCONT)
    results = [node.communicate(timeout=120) for node in nodes]
    for node, (_, stderr) in zip(nodes, results, strict=True):
        assert node.returncode == 75, stderr[-3000:]
        [line] = stderr.splitlines()
        assert STOPPED.match(line), line
    assert not (tmp_path / "final").exists()

    resumed = run_launch([*demo[1], *FAULT_RUN, f"output_dir={tmp_path}"])  # one node, the same 2 ranks
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr and (tmp_path / "final").is_dir()


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_one_process_alone_stops_after_a_checkpoint_with_75(demo, tmp_path: Path, number, reap) -> None:
    """``python -m <package>`` keeps launch.sh's contract: a checkpoint, one line, exit 75."""
    run = [*ON_THIS_MACHINE, *demo[1], *FAULT_RUN, f"output_dir={tmp_path}"]
    command = [sys.executable, "-m", PACKAGE, *run]
    alone = subprocess.Popen(command, env=launch_env(1), stderr=subprocess.PIPE, text=True)
    reap.append(alone.pid)
    wait_for_checkpoint(tmp_path, alone)
    for sent in (signal.SIGSTOP, number, signal.SIGCONT):  # paused: it cannot finish before the signal
        alone.send_signal(sent)
    _, stderr = alone.communicate(timeout=120)
    assert alone.returncode == 75, stderr[-3000:]
    assert f"preempted: stopped by {number.name}" in stderr and "run the same command" in stderr
    assert len(list((tmp_path / "checkpoints").glob("step-*.pt"))) >= 2  # the periodic one and the stop's
