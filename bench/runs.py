"""How each runner is started on a workload, and where its timeline comes from."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import analysis
import measure
from workloads import Workload, project_overrides, runner_spec

BENCH = Path(__file__).resolve().parent
WORLD_SIZE = 2
# The hand-written runners, by name; "project" is the generated project's own launch.sh.
SCRIPTS = {
    "plain": "plain.py",
    "accelerate": "accelerate_loop.py",
    "fabric": "fabric_loop.py",
    "trainer": "hf_trainer.py",
    "trainer-grouped": "hf_trainer.py",
}
RUNNERS = ["project", *SCRIPTS]
PEERS = ["accelerate", "fabric", "trainer"]  # their defaults; trainer-grouped is the Trainer's opt-in
LABELS = {
    "project": "generated project",
    "plain": "plain DDP loop",
    "accelerate": "Accelerate",
    "fabric": "Lightning Fabric",
    "trainer": "transformers Trainer",
    "trainer-grouped": "Trainer, group_by_length (opt-in)",
}


def base_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "PET_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"  # one thread per process on 2 cores, for every runner
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run(
    runner: str,
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
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    env = base_env()
    if runner == "project":
        output = directory / "output"
        command = [str(project / "launch.sh"), *project_overrides(workload, inputs, precision, seed, output)]
        env.update(NPROC_PER_NODE=str(WORLD_SIZE), PYTHONPATH=str(project / "src"))
        timeline_file = output / "metrics.jsonl"
    else:
        timeline_file = directory / "timeline.json"
        spec = runner_spec(workload, inputs, precision, seed, timeline_file)
        spec["grouped"] = runner == "trainer-grouped"
        (directory / "spec.json").write_text(json.dumps(spec, indent=1))
        torchrun = str(Path(sys.executable).parent / "torchrun")
        script = str(BENCH / "runners" / SCRIPTS[runner])
        command = [
            torchrun,
            "--standalone",
            f"--nproc-per-node={WORLD_SIZE}",
            script,
            str(directory / "spec.json"),
        ]
    job = measure.run_job(command, env, directory, directory / "log.txt", timeout_s, WORLD_SIZE)
    if job.returncode != 0 or not timeline_file.exists():
        return job, None
    if runner == "project":
        return job, analysis.project_timeline(timeline_file)
    return job, analysis.runner_timeline(timeline_file)
