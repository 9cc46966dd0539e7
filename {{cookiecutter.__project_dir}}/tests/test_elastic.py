"""Elastic jobs: launch.sh's ``NNODES=MIN:MAX``. When a node is lost, torchrun restarts the workers on the
nodes left; they resume from the newest checkpoint and accumulate more micro-batches, so the optimizer
sees the global batch of MAX nodes throughout (parallel/elastic.py, launch/launcher.py). A node that comes
later is taken in the same way (launch/joining_nodes.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import PROJECT, deterministic_overrides, launch_env, read_metrics, start_launch
from emulated_hosts import emulated_hosts, unavailable
from weights import final_weights

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.launch import (
    launcher,
)
from {{ cookiecutter.package_name }}.parallel.elastic import (
    MAX_NNODES_ENV,
    keep_global_batch,
)
from {{ cookiecutter.package_name }}.parallel.environment import (
    Verdict,
    write_verdict,
)


@pytest.mark.parametrize(
    ("batch", "accumulation", "per_node", "world", "kept"),
    [
        (4, 2, 1, 1, (4, 4)),  # 1 of 2 nodes: twice the micro-steps
        (4, 2, 2, 4, (4, 3)),  # 2 of 3 nodes of 2 processes: 48 samples, 12 per process
        (4, 1, 2, 4, (3, 2)),  # 6 per process: the largest micro-batch below 4 that divides it
        (4, 2, 2, 6, (4, 2)),  # every node left: nothing changes
    ],
)
def test_an_elastic_job_on_fewer_nodes_keeps_the_global_batch_of_all(
    monkeypatch: pytest.MonkeyPatch, batch: int, accumulation: int, per_node: int, world: int, kept: tuple
) -> None:
    max_nodes = 2 if per_node == 1 else 3
    monkeypatch.setenv(MAX_NNODES_ENV, str(max_nodes))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    config = load_config([f"data.batch_size={batch}", f"train.grad_accum_steps={accumulation}"])
    resized = keep_global_batch(config, world)
    assert (resized.data.batch_size, resized.train.grad_accum_steps) == kept
    planned = batch * accumulation * max_nodes * per_node
    assert resized.data.batch_size * resized.train.grad_accum_steps * world == planned
    assert resized.train.lr == config.train.lr and resized.output_dir == config.output_dir


def test_a_global_batch_the_processes_left_cannot_share_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MAX_NNODES_ENV, "3")  # 2 of 3 nodes of 2 processes each are left
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    config = load_config(["data.batch_size=1", "train.grad_accum_steps=1"])
    with pytest.raises(ConfigError) as refused:
        keep_global_batch(config, 4)
    assert "goes on with 4 of its 6 processes, which cannot share its global batch of 6" in str(refused.value)
    assert "a multiple of 4" in str(refused.value) and "\n" not in str(refused.value)


def test_a_job_that_is_not_elastic_keeps_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_NNODES_ENV, raising=False)
    config = load_config([])
    assert keep_global_batch(config, 2) is config


@pytest.mark.parametrize(
    ("args", "restarts"),
    [
        (["--nnodes=1:2", "--max-restarts=1"], 1),
        (["--nnodes=2:4", "--max-restarts=3"], 3),
        (["--nnodes=2", "--max-restarts=3"], 0),  # a fixed count: a lost node ends the job
        (["--nnodes=2:2", "--max-restarts=3"], 0),
        (["--standalone", "--max-restarts=2"], 0),
    ],
)
def test_only_an_elastic_range_lets_torchrun_go_on_after_a_lost_node(args: list[str], restarts: int) -> None:
    assert launcher.elastic_restarts([*args, "-m", "pkg", "train.lr=1e-4"]) == restarts


def lost(status: Path, attempt: int, rendezvous_host: bool = False) -> None:
    who = "the rendezvous host (h0)" if rendezvous_host else "node 1 (host1)"
    line = f"{who} was lost: ...; run the same command again on every node to resume"
    write_verdict(status, Verdict(line, who, rendezvous_host, attempt))


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """launcher.end_when_a_node_is_lost, with os._exit recorded instead of done."""
    exits: list[int] = []
    monkeypatch.setattr(launcher, "LOST_NODE_GRACE_S", 0.0)
    monkeypatch.setattr(launcher, "concluded", threading.Lock())
    monkeypatch.setattr(launcher.os, "_exit", exits.append)
    return exits


def test_an_elastic_launcher_ends_only_once_its_restarts_are_spent(
    watch: list[int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    thread = threading.Thread(target=launcher.end_when_a_node_is_lost, args=(tmp_path, 1), daemon=True)
    thread.start()
    lost(tmp_path, attempt=0)
    deadline = time.monotonic() + 30
    while "goes on" not in capsys.readouterr().err:  # printed from the thread, once it saw the verdict
        assert time.monotonic() < deadline, "the launcher said nothing of the lost node"
        time.sleep(0.1)
    assert thread.is_alive() and watch == []
    lost(tmp_path, attempt=1)  # the restarted workers lost a node too: no restart is left
    thread.join(timeout=30)
    assert watch == [75]
    assert "node 1 (host1) was lost" in capsys.readouterr().err


def test_an_elastic_job_that_lost_its_rendezvous_host_ends_at_once(watch: list[int], tmp_path: Path) -> None:
    lost(tmp_path, attempt=0, rendezvous_host=True)
    launcher.end_when_a_node_is_lost(tmp_path, 3)
    assert watch == [75]


# Node 1's worker kills every process of its node (launch.sh, its launcher, itself) as its step
# KILL_NODE_AT_STEP begins: after the checkpoint of step 4, which rank 0 wrote before step 5's all-reduce.
KILL_NODE_AT_STEP = """
import os, signal
from pathlib import Path
if os.environ.get("KILL_NODE_AT_STEP"):
    from {{ cookiecutter.package_name }}.loop import trainer

    step = trainer.Trainer.optimizer_step
    begun = []

    def optimizer_step(self, *args, **kwargs):
        begun.append(1)
        if len(begun) == int(os.environ["KILL_NODE_AT_STEP"]):
            launcher = os.getppid()
            launch_sh = int(Path(f"/proc/{launcher}/stat").read_text().rpartition(")")[2].split()[1])
            for pid in (launch_sh, launcher, os.getpid()):
                os.kill(pid, signal.SIGKILL)
        return step(self, *args, **kwargs)

    trainer.Trainer.optimizer_step = optimizer_step
"""
# 8 steps, a checkpoint every 4: the tolerance below holds over a few steps (Adam turns the rounding of
# tiny gradients into steps of up to lr, so differences grow with the steps), as in the other proofs.
RUN = ["train.max_steps=8", "checkpoint.every_steps=4", "train.log_every_steps=1"]


@pytest.mark.slow
@pytest.mark.ddp_guarantees
def test_an_elastic_job_goes_on_alone_when_a_node_is_killed(demo, tmp_path: Path) -> None:
    """NNODES=1:2 on 2 emulated hosts x 1 process. Node 1 comes once node 0 trains alone and is taken in;
    every process of node 1 is killed as its step 6 begins: node 0 continues by itself from the checkpoint
    of step 4 and ends with the weights of an uninterrupted 2-process run, within the tolerance of the
    world-size proofs (the float sums run in another order)."""
    if reason := unavailable():
        pytest.skip(reason)
    args = [*deterministic_overrides(demo, tmp_path), *RUN]
    reference = start_launch([*args, f"output_dir={tmp_path / 'reference'}"])  # side by side
    sites = {0: tmp_path / "site0", 1: tmp_path / "site1"}
    for site, hook in ((sites[0], WAIT_FOR_JOINING_NODE), (sites[1], KILL_NODE_AT_STEP)):
        site.mkdir()
        (site / "sitecustomize.py").write_text(hook)
    output_dir = tmp_path / "elastic"
    with emulated_hosts(["host0", "host1"]) as hosts:
        nodes = []
        for node, host in enumerate(hosts):
            env = launch_env(1, NNODES="1:2", NODE_RANK=str(node), MASTER_ADDR="host0", RUN_ID="elastic")
            env["PYTHONPATH"] = f"{sites[node]}{os.pathsep}{env['PYTHONPATH']}"
            # Node 0 holds its first step until torchrun stops it to take in node 1 (WAIT_FOR_JOINING_NODE).
            env.update({0: {"WAIT_AT_STEP": "1"}, 1: {"KILL_NODE_AT_STEP": "6"}}[node])
            if node == 1:  # after torchrun's last call: a node joining a running job
                await_line(nodes[0], tmp_path / "node0.log", "training 8 steps on 1 process(es)")
            with (tmp_path / f"node{node}.log").open("w") as log:
                command = host.command([str(PROJECT / "launch.sh"), *args, f"output_dir={output_dir}"])
                nodes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            killed = nodes[1].wait(timeout=600)
            code = nodes[0].wait(timeout=600)
        except subprocess.TimeoutExpired:
            for process in nodes:
                process.kill()
            logs = "\n".join(
                f"node{index}.log:\n{read(tmp_path / f'node{index}.log')[-3000:]}" for index in (0, 1)
            )
            raise AssertionError(f"the elastic job did not end in 10 minutes\n{logs}") from None
    log = read(tmp_path / "node0.log")
    assert "launch.sh: a node joined this elastic job" in log, log[-4000:]
    assert killed == -signal.SIGKILL, read(tmp_path / "node1.log")[-4000:]
    assert code == 0, log[-4000:]
    assert reference.wait(timeout=600) == 0, reference.communicate()[1][-4000:]
    going_on = r"launch\.sh: node \d \(host1\) was lost; this elastic job goes on with the nodes left"
    assert re.search(going_on, log), log[-4000:]
    assert "each process accumulates 2 micro-batches" in log, log[-4000:]
    assert f"resumed from {output_dir / 'checkpoints' / 'step-00000004.pt'} (step 4," in log, log[-4000:]
    steps = [record["step"] for record in read_metrics(output_dir) if "loss" in record]
    assert steps == [record["step"] for record in read_metrics(tmp_path / "reference") if "loss" in record]
    resumed, uninterrupted = final_weights(output_dir), final_weights(tmp_path / "reference")
    assert resumed.keys() == uninterrupted.keys()
    worst = max((resumed[key] - uninterrupted[key]).abs().max().item() for key in resumed)
    assert worst <= 1e-4, f"the elastic run differs by up to {worst:.2e}"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def await_line(node: subprocess.Popen, log: Path, line: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while line not in read(log):
        assert node.poll() is None, f"node 0 ended before it trained alone:\n{read(log)[-4000:]}"
        assert time.monotonic() < deadline, (
            f"node 0 did not train alone in {timeout:.0f} s:\n{read(log)[-3000:]}"
        )
        time.sleep(0.2)


# Node 0's worker, alone in the job's first group, waits as its step WAIT_AT_STEP begins until torchrun stops
# it (to take in the node that joined): the other node, started once node 0 trains alone, then joins a job
# that is training, however slow the machine, and never one that has ended.
WAIT_FOR_JOINING_NODE = """
import os, time
first_group = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"  # not a restart after a loss
if os.environ.get("WAIT_AT_STEP") and os.environ.get("WORLD_SIZE") == "1" and first_group:
    from {{ cookiecutter.package_name }}.launch import preemption
    from {{ cookiecutter.package_name }}.loop import trainer

    record, step = preemption.PreemptionWatch._record, trainer.Trainer.optimizer_step
    stopped, begun = [], []

    def _record(self, number, frame):
        stopped.append(number)
        return record(self, number, frame)

    def optimizer_step(self, *args, **kwargs):
        begun.append(1)
        if len(begun) == int(os.environ["WAIT_AT_STEP"]):
            deadline = time.monotonic() + 600
            while not stopped and time.monotonic() < deadline:
                time.sleep(0.05)
        return step(self, *args, **kwargs)

    preemption.PreemptionWatch._record = _record
    trainer.Trainer.optimizer_step = optimizer_step
"""
