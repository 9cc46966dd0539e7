"""The data-scale bench: ``python bench/data_scale.py [--sizes 4000,100000,1000000]``.

Renders the text-classification project twice, from this checkout and from ``--baseline`` (a git ref:
the implementation to compare with), builds a MiniLM-shaped checkpoint and generated JSON Lines of each
size once (reused from ``--work-dir`` afterwards), then measures, per size and implementation:

- ``launch.sh`` with 2 processes and 3 training steps: time to the first step on a first run and on a
  cached rerun (``checkpoint.start_over=true``: same output_dir, the cache kept), each rank's peak RSS,
  the cache's size on disk;
- preprocessing alone (``build_data`` in one process, world size 1): seconds and lines/s, by the number
  of processes that tokenize.

Writes ``bench/results/data-scale-<date>-<cpu>-<cores>cores.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import data_scale_assets as assets
import measure

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORLD_SIZE = 2
RUN = [
    "data.val_file=",
    "train.max_steps=3",
    "train.epochs=1",
    "train.log_every_steps=1",
    "train.precision=fp32",
]
# Preprocessing alone: wall seconds, and CPU seconds of this process and the processes it waited for.
PREPROCESS_ONLY = """
import resource, sys, time, torch
from {package}.config import load_config
try:
    from {package}.parallel.process_group import DistEnv
except ModuleNotFoundError:  # the baseline's flat layout
    from {package}.distributed import DistEnv
from {package}.model_type.task import TASK
def cpu():
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
config = load_config(sys.argv[1:])
started, used = time.perf_counter(), cpu()
data = TASK.build_data(config, DistEnv(0, 0, 1, torch.device("cpu")))
print(len(data.train), time.perf_counter() - started, cpu() - used)
"""


def environment(project: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "PET_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(project / "src")
    env |= {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    return env | {"NPROC_PER_NODE": str(WORLD_SIZE), "NNODES": "1"}


def render(ref: str | None, directory: Path) -> Path:
    """The text-classification project of this checkout (``ref`` None) or of a git ref."""
    from cookiecutter.main import cookiecutter

    template = REPO
    subprocess.run(["rm", "-rf", str(directory)], check=True)  # rendered afresh: the code under test
    if ref is not None:
        template = directory / "template"
        template.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(template)], input=archive.stdout, check=True)
    answers = {"project_slug": "scale", "model_type": "text-classification", "gpus_per_node": "0"}
    answers |= {"backend": "gloo", "precision": "fp32"}
    out = cookiecutter(str(template), no_input=True, extra_context=answers, output_dir=str(directory))
    return Path(out)


def first_step_s(output_dir: Path, launched: float) -> float | None:
    try:
        lines = (output_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    records = [json.loads(line) for line in lines]
    return next((r["time"] - launched for r in records if "loss" in r), None)


def size_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def launch(project: Path, overrides: list[str], output_dir: Path, log: Path) -> dict:
    command = [str(project / "launch.sh"), *overrides, f"output_dir={output_dir}"]
    job = measure.run_job(command, environment(project), project, log, timeout_s=3600, world_size=WORLD_SIZE)
    if job.returncode:
        raise SystemExit(f"error: {' '.join(command)} failed ({job.returncode}):\n{job.stderr_tail}")
    return {
        "load": load_average(),
        "wall_s": job.wall_s,
        "first_step_s": first_step_s(output_dir, job.launched),
        "rss_mb": [job.peak_rss_mb.get(rank) for rank in range(WORLD_SIZE)],
    }


def preprocess(project: Path, overrides: list[str], output_dir: Path) -> dict:
    script = PREPROCESS_ONLY.format(package="scale")
    command = [sys.executable, "-c", script, *overrides, f"output_dir={output_dir}"]
    done = subprocess.run(command, env=environment(project), capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"error: preprocessing failed:\n{done.stderr[-3000:]}")
    lines, seconds, cpu_s = done.stdout.split()[-3:]
    return {"seconds": float(seconds), "cpu_s": float(cpu_s), "lines_per_s": int(lines) / float(seconds)}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4000,100000,1000000")
    parser.add_argument(
        "--throughput-sizes", default="100000,1000000", help="sizes of the preprocessing runs"
    )
    parser.add_argument("--processes", default="1,2", help="processes that tokenize, one run each")
    parser.add_argument("--baseline", default="259071a", help="git ref of the implementation to compare")
    parser.add_argument("--work-dir", type=Path, default=REPO / "build" / "bench" / "data-scale")
    parser.add_argument("--results-dir", type=Path, default=BENCH / "results")
    args = parser.parse_args(argv)
    work: Path = args.work_dir.resolve()
    sizes = [int(size) for size in args.sizes.split(",")]
    counts = [int(size) for size in args.throughput_sizes.split(",")]
    runs = [("today", size, 1) for size in counts]  # one process: today's has no other way
    runs += [("datasets", size, int(count)) for size in counts for count in args.processes.split(",")]
    inputs = assets.build(work / "assets", sorted({*sizes, *counts}))
    projects = {"today": render(args.baseline, work / "today"), "datasets": render(None, work / "datasets")}
    import data_scale_report
    import provenance

    commit = provenance.current_commit(data_scale_report.PREFIX)
    results: dict = {"template_commit": commit, "baseline": args.baseline, "load_before": load_average()}
    results |= {"launch": [], "preprocess": []}
    for size in sizes:
        for name, project in projects.items():
            output_dir = work / "runs" / f"{name}-{size}"
            subprocess.run(["rm", "-rf", str(output_dir)], check=True)
            overrides = [*RUN, f"model.pretrained={inputs['model']}", f"data.train_file={inputs[size]}"]
            first = launch(project, overrides, output_dir, work / f"{name}-{size}.log")
            rerun = launch(
                project, [*overrides, "checkpoint.start_over=true"], output_dir, work / "rerun.log"
            )
            entry = {"lines": size, "implementation": name, "first": first, "rerun": rerun}
            results["launch"].append(entry | {"cache_mb": size_mb(output_dir / "cache")})
            print(json.dumps(results["launch"][-1]), flush=True)
    for name, size, processes in sorted(runs, key=lambda run: run[1]):
        extra = [] if name == "today" else [f"data.preprocessing_processes={processes}"]
        overrides = [
            f"model.pretrained={inputs['model']}",
            f"data.train_file={inputs[size]}",
            *RUN[:2],  # no validation file; data.max_length
            *extra,
        ]
        output_dir = work / "runs" / f"preprocess-{name}-{size}-{processes}"
        subprocess.run(["rm", "-rf", str(output_dir)], check=True)
        timing = preprocess(projects[name], overrides, output_dir) | {"load": load_average()}
        results["preprocess"].append(
            {"lines": size, "implementation": name, "processes": processes, **timing}
        )
        print(json.dumps(results["preprocess"][-1]), flush=True)
    results["load_after"] = load_average()
    data_scale_report.write(results, args.results_dir, time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
