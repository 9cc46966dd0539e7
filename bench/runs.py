"""The runners: who trains on a workload and how each is started, and where its timeline comes from."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import analysis
import measure
from workloads import WORLD_SIZE, Workload, global_batch, project_overrides, runner_spec

BENCH = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Runner:
    label: str
    script: str = ""  # under bench/runners/; empty: the generated project's own launch.sh
    peer: bool = True  # another way to train, counted in "the best peer"; False: the project's own rows
    overrides: tuple[str, ...] = ()  # the project's key=value settings on top of the shared ones
    spec: dict = field(default_factory=dict)  # a hand-written runner's settings on top of the shared ones
    env: dict = field(default_factory=dict)  # the environment on top of the bench's
    processes: int = WORLD_SIZE
    workloads: frozenset[str] | None = None  # None: every workload that lists no runners of its own

    @property
    def is_project(self) -> bool:
        return not self.script


CORES = str(os.cpu_count() or 1)
RUNNERS = {
    "project": Runner("generated project", peer=False),
    "plain": Runner("plain DDP loop", "plain.py"),
    "accelerate": Runner("Accelerate", "accelerate_loop.py"),
    "fabric": Runner("Lightning Fabric", "fabric_loop.py"),
    "trainer": Runner("transformers Trainer", "hf_trainer.py"),
    # The peers' answer to padding, which users must know to turn on: it changes nothing at fixed length.
    "trainer-grouped": Runner(
        "Trainer, group_by_length (opt-in)",
        "hf_trainer.py",
        spec={"grouped": True},
        workloads=frozenset({"variable", "steps"}),
    ),
    # The project's own settings, each against its default row (the same code but for one thing).
    "project-random": Runner(
        "project, data.group_by_length=false",
        peer=False,
        overrides=("data.group_by_length=false",),
        workloads=frozenset({"variable", "steps"}),
    ),
    "project-grouped": Runner(
        "project, data.group_by_length=true",
        peer=False,
        overrides=("data.group_by_length=true",),
        workloads=frozenset({"sft"}),
    ),
    "project-workers": Runner(
        "project, data.num_workers=2",
        peer=False,
        overrides=("data.num_workers=2",),
        workloads=frozenset({"fixed", "variable"}),
    ),
    "project-1proc-1thread": Runner(
        "project, 1 process, OMP_NUM_THREADS=1",
        peer=False,
        env={"OMP_NUM_THREADS": "1"},
        processes=1,
        workloads=frozenset({"threads"}),
    ),
    "project-1proc-cores": Runner(
        f"project, 1 process, OMP_NUM_THREADS={CORES} (the cores)",
        peer=False,
        env={"OMP_NUM_THREADS": CORES},
        processes=1,
        workloads=frozenset({"threads"}),
    ),
    # launch.sh tunes glibc's malloc unless the environment does; a neutral tunable keeps glibc's defaults.
    "project-glibc-malloc": Runner(
        "project, glibc's malloc defaults",
        peer=False,
        env={"GLIBC_TUNABLES": "glibc.malloc.perturb=0"},
        workloads=frozenset({"fixed", "causal"}),
    ),
    # bf16 autocast against fp32: the bench's precision is one of them, this row the other.
    "plain-other-precision": Runner(
        "plain DDP loop, the other precision",
        "plain.py",
        peer=False,
        spec={"precision": "other"},
        workloads=frozenset({"fixed"}),
    ),
}
OTHER_PRECISION = {"bf16": "fp32", "fp32": "bf16"}
LABELS = {name: runner.label for name, runner in RUNNERS.items()}
PEERS = [name for name, runner in RUNNERS.items() if runner.peer]


def runs_on(name: str, workload: Workload) -> bool:
    """Whether runner ``name`` runs on ``workload``: the workload's own list decides where it has one."""
    if workload.runners:
        return name in workload.runners
    allowed = RUNNERS[name].workloads
    return allowed is None or workload.name in allowed


def base_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "PET_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"  # one thread per process on 2 cores, for every runner
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run(
    name: str,
    workload: Workload,
    inputs: dict[str, str],
    project: Path,
    precision: str,
    seed: int,
    directory: Path,
    timeout_s: float,
) -> tuple[measure.Job, analysis.Timeline | None]:
    """One run in a fresh ``directory``: the job as measured from outside, and its timeline (None if it
    failed). A directory left by an earlier bench is emptied first: the project would resume from it."""
    runner = RUNNERS[name]
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    env = base_env() | runner.env
    per_process = global_batch(workload) // runner.processes
    if runner.is_project:
        output = directory / "output"
        settings = project_overrides(workload, inputs, precision, seed, output, per_process)
        command = [str(project / "launch.sh"), *settings, *runner.overrides]
        env.update(NPROC_PER_NODE=str(runner.processes), PYTHONPATH=str(project / "src"))
        timeline_file = output / "metrics.jsonl"
    else:
        timeline_file = directory / "timeline.json"
        spec = runner_spec(workload, inputs, precision, seed, timeline_file, per_process) | runner.spec
        if spec["precision"] == "other":
            spec["precision"] = OTHER_PRECISION[precision]
        (directory / "spec.json").write_text(json.dumps(spec, indent=1))
        torchrun = str(Path(sys.executable).parent / "torchrun")
        script = str(BENCH / "runners" / runner.script)
        command = [torchrun, "--standalone", f"--nproc-per-node={runner.processes}", script]
        command.append(str(directory / "spec.json"))
    job = measure.run_job(command, env, directory, directory / "log.txt", timeout_s, runner.processes)
    if job.returncode != 0 or not timeline_file.exists():
        return job, None
    if runner.is_project:
        return job, analysis.project_timeline(timeline_file)
    return job, analysis.runner_timeline(timeline_file)
