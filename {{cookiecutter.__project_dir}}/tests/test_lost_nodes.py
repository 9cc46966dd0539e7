"""A lost node ends every other node within a minute, named, with exit 75, and the same command resumes;
a slow node is not lost. Each job runs on hosts of its own (tests/emulated_hosts.py: a network namespace,
hostname and hosts file per node), all jobs side by side, under the defaults (distributed.node_timeout_s
30, no timeout overrides):

- killed: every process of node 0, the rendezvous host, gets SIGKILL; of node 1 too, in a job of its own
  (its sockets close at once, so the survivor's collective fails before the node is found lost);
- frozen: every process of node 1 gets SIGSTOP, and SIGCONT once the other node has ended;
- cut off: node 1's link goes down (no FIN, as after a dead switch or a power loss), on 2 x 1 and 2 x 2;
- slow: rank 0 preprocesses, saves a checkpoint and evaluates for longer than the bound each.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import FAULT_RUN, PROJECT, launch_env, read_metrics
from emulated_hosts import Host, emulated_hosts, unavailable
from weights import final_weights

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]

BOUND_S = 60  # every surviving node ends within this of the fault
SLOW_S = 40  # longer than distributed.node_timeout_s: each slow part alone would be taken for a loss
# Rank 0's slow parts, injected through sitecustomize: preprocessing, the first checkpoint write and the
# first evaluation.
SLOW_RANK_0 = f"""
import dataclasses, os, pathlib, time
if os.environ.get("RANK") == "0":
    from {{ cookiecutter.package_name }}.loop import trainer
    from {{ cookiecutter.package_name }}.parallel import checkpoint
    from {{ cookiecutter.package_name }}.model_type import task

    def slowly(function, name):  # the first call only: one of each is enough
        def slow(*args, **kwargs):
            mark = pathlib.Path(os.environ["SLOW_MARKS"]) / name
            if not mark.exists():
                time.sleep({SLOW_S})
                mark.write_text("slept")
            return function(*args, **kwargs)
        return slow

    task.TASK = dataclasses.replace(task.TASK, build_data=slowly(task.TASK.build_data, "preprocessing"))
    checkpoint.Checkpointer.save = slowly(checkpoint.Checkpointer.save, "checkpoint")
    trainer.Trainer.evaluate = slowly(trainer.Trainer.evaluate, "evaluation")
"""


@dataclass
class Job:
    name: str
    fault: str  # killed, frozen, cut off, slow
    victim: int  # the node the fault strikes
    nproc: int = 1
    again: bool = True  # run again after the fault, to resume
    hosts: list[Host] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    fault_at: float = 0.0
    ended_at: dict[int, float] = field(default_factory=dict)
    codes: dict[int, int] = field(default_factory=dict)  # each node's exit code after the fault
    written: dict[str, object] = field(default_factory=dict)  # output_dir once the survivor ended
    before_resume: dict[str, object] = field(default_factory=dict)  # and once every node had ended
    resumed: list[int] = field(default_factory=list)  # the exit codes of the same command run again

    @property
    def resumes(self) -> bool:
        """The jobs run again and compared with the uninterrupted 2-process run."""
        return self.fault != "slow" and self.nproc == 1 and self.again

    def start(self, args: list[str], logs: Path, env: dict[str, str], run: str = "first") -> None:
        self.processes = []
        for node, host in enumerate(self.hosts):
            rendezvous = {"NNODES": "2", "NODE_RANK": str(node), "MASTER_ADDR": self.hosts[0].hostname,
                          "MASTER_PORT": "29500", "RUN_ID": self.name}  # fmt: skip
            with (logs / f"{self.name}-{node}-{run}.log").open("w") as log:
                command = host.command([str(PROJECT / "launch.sh"), *args])
                node_env = {**launch_env(self.nproc, **rendezvous), **env}
                self.processes.append(subprocess.Popen(command, env=node_env, stdout=log, stderr=log))

    def strike(self) -> None:
        host, self.fault_at = self.hosts[self.victim], time.monotonic()
        if self.fault == "cut off":
            subprocess.run(["ip", "-n", host.namespace, "link", "set", "eth0", "down"], check=True)
        elif self.fault in ("killed", "frozen"):
            number = signal.SIGKILL if self.fault == "killed" else signal.SIGSTOP
            for pid in subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True,
                                      text=True, check=True).stdout.split():  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), number)


def snapshot(output_dir: Path) -> dict[str, object]:
    """What rank 0 has written: checkpoints, metrics and final/."""
    checkpoints = sorted(path.name for path in (output_dir / "checkpoints").glob("step-*"))
    metrics = (output_dir / "metrics.jsonl").read_bytes() if (output_dir / "metrics.jsonl").exists() else b""
    return {"checkpoints": checkpoints, "metrics": metrics, "final": (output_dir / "final").exists()}


JOBS = [Job("killed", "killed", victim=0), Job("killed-1", "killed", victim=1, again=False),
        Job("frozen", "frozen", victim=1),
        Job("cut-off", "cut off", victim=1), Job("cut-off-2x2", "cut off", victim=1, nproc=2),
        Job("slow", "slow", victim=0)]  # fmt: skip


@pytest.fixture(scope="module")
def jobs(demo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Job, Path, Path]]:
    """Every job, side by side: started, struck after its first checkpoint, ended; then the same command
    run again on every host of a job that a fault ended. -> name: (job, output_dir, logs)."""
    if reason := unavailable():
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lost-nodes")
    slow_site = root / "slow-site"
    slow_site.mkdir()
    (slow_site / "sitecustomize.py").write_text(SLOW_RANK_0)
    args = {job.name: [*demo[1], *FAULT_RUN, f"output_dir={root / job.name}"] for job in JOBS}
    envs = {job.name: {} for job in JOBS}
    envs["slow"] = {"PYTHONPATH": f"{slow_site}{os.pathsep}{PROJECT / 'src'}", "SLOW_MARKS": str(slow_site)}
    with contextlib.ExitStack() as stack:
        for job in JOBS:
            job.hosts = stack.enter_context(emulated_hosts(["host0", "host1"]))
            job.start(args[job.name], root, envs[job.name])
        deadline = time.monotonic() + 900
        while any(len(job.ended_at) < 2 for job in JOBS) and time.monotonic() < deadline:
            for job in JOBS:
                follow(job, root / job.name)
            time.sleep(0.2)
        for job in JOBS:
            for process in job.processes:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            if not job.before_resume:
                job.before_resume = snapshot(root / job.name)
        for job in [job for job in JOBS if job.resumes]:  # the same command again, the link back up
            job.before_resume = snapshot(root / job.name)
            subprocess.run(["ip", "-n", job.hosts[1].namespace, "link", "set", "eth0", "up"], check=True)
            job.start(args[job.name], root, envs[job.name], run="again")
        for job in [job for job in JOBS if job.resumes]:
            job.resumed = [process.wait(timeout=900) for process in job.processes]
    return {job.name: (job, root / job.name, root) for job in JOBS}


def follow(job: Job, output_dir: Path) -> None:
    """One look at a job: strike it after its first checkpoint, note which nodes ended when."""
    if not job.fault_at and job.fault != "slow" and list((output_dir / "checkpoints").glob("step-*")):
        job.strike()
    for node, process in enumerate(job.processes):
        if node not in job.ended_at and process.poll() is not None:
            job.ended_at[node], job.codes[node] = time.monotonic(), process.returncode
    survivor = 1 - job.victim
    if job.fault != "slow" and survivor in job.ended_at and not job.written:
        job.written = snapshot(output_dir)
        if job.fault == "frozen":  # it comes back after the others ended
            for pid in subprocess.run(["ip", "netns", "pids", job.hosts[job.victim].namespace],
                                      capture_output=True, text=True).stdout.split():  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGCONT)


def last_line(logs: Path, job: Job, node: int, run: str = "first") -> str:
    return (logs / f"{job.name}-{node}-{run}.log").read_text(encoding="utf-8").strip().splitlines()[-1]


@pytest.mark.parametrize("name", [job.name for job in JOBS if job.fault != "slow"])
def test_every_other_node_ends_within_a_minute_naming_the_lost_one(jobs, name: str) -> None:
    job, _, logs = jobs[name]
    survivor = 1 - job.victim
    assert job.codes[survivor] == 75, last_line(logs, job, survivor)
    took = job.ended_at[survivor] - job.fault_at
    assert took <= BOUND_S, f"node {survivor} ended {took:.0f} s after the fault"
    checkpoints = job.written["checkpoints"]
    assert isinstance(checkpoints, list) and checkpoints, "no checkpoint before the fault"
    newest = max(int(re.sub(r"\D", "", checkpoint)) for checkpoint in checkpoints)
    line = last_line(logs, job, survivor)
    assert re.fullmatch(
        rf"launch\.sh: node {job.victim} \(host{job.victim}\) was lost: .*; the newest complete checkpoint "
        rf"is step {newest}; run the same command again on every node to resume",
        line,
    ), line


@pytest.mark.parametrize("name", ["frozen", "cut-off", "cut-off-2x2"])
def test_a_frozen_or_cut_off_node_ends_too_and_writes_nothing_after_the_others(jobs, name: str) -> None:
    job, _, logs = jobs[name]
    assert job.codes[job.victim] == 75
    assert "run the same command again on every node" in last_line(logs, job, job.victim)
    assert job.written["final"] is False
    # No checkpoint, metrics record or final/ after the survivor ended.
    assert job.before_resume == job.written


@pytest.mark.parametrize("name", [job.name for job in JOBS if job.resumes])
def test_the_same_command_resumes_to_the_uninterrupted_weights(jobs, reference: Path, name: str) -> None:
    job, output_dir, logs = jobs[name]
    assert job.resumed == [0, 0], [last_line(logs, job, node, run="again") for node in (0, 1)]
    resumed, uninterrupted = final_weights(output_dir), final_weights(reference)
    assert resumed.keys() == uninterrupted.keys()
    worst = max((resumed[key] - uninterrupted[key]).abs().max().item() for key in resumed)
    assert worst <= 1e-5, worst


def test_a_slow_node_is_not_lost(jobs) -> None:
    job, output_dir, logs = jobs["slow"]
    slept = sorted(path.name for path in (logs / "slow-site").iterdir() if path.name != "sitecustomize.py")
    assert slept == ["checkpoint", "evaluation", "preprocessing"]  # each longer than the bound
    assert job.codes == {0: 0, 1: 0}, last_line(logs, job, 0)
    assert (output_dir / "final").is_dir()
    assert read_metrics(output_dir)[-1]["step"] > 0
