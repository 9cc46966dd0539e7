"""The bench: ``python bench/run.py [--rounds 3] [--workloads fixed,variable,causal] [--quick]``.

Renders the generated projects, builds each workload's checkpoint and data, then runs every runner on
every workload, interleaved round by round, and prints one table per workload plus the targets. Results
(Markdown and the raw JSON) go to bench/results/, named by date and machine; --quick runs a few steps
of each for a smoke test and writes under build/bench/ instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import analysis
import report
import runs
from workloads import SEED, WORKLOADS, build_inputs, global_batch, quick, training_samples

REPO = Path(__file__).resolve().parents[1]
SETTLE_S = 2.0  # idle seconds before each run: the previous job's exit does not overlap the next launch
MIN_ROUNDS = 3  # the default, and the fewest rounds a committed table may rest on


def cpu_has_bf16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def render_project(model_type: str, directory: Path) -> Path:
    from cookiecutter.main import cookiecutter

    slug = f"bench-{model_type}"
    answers = {"project_name": slug, "project_slug": slug, "model_type": model_type}
    answers |= {"gpus_per_node": "0", "backend": "gloo", "precision": "bf16"}
    return Path(
        cookiecutter(
            str(REPO),
            no_input=True,
            extra_context=answers,
            output_dir=str(directory),
            overwrite_if_exists=True,
        )
    )


def measure_run(job, timeline, workload, epoch_steps: int, tokens_per_sample: float) -> dict:
    result = {
        "returncode": job.returncode,
        "wall_s": job.wall_s if timeline else None,
        "launched": job.launched,
    }
    result |= {"rss0": job.peak_rss_mb.get(0), "rss1": job.peak_rss_mb.get(1)}
    if timeline is None:
        return result
    if max(timeline.steps) < epoch_steps or not timeline.evals:
        return result | {"wall_s": None, "error": f"ended at step {max(timeline.steps)} of {epoch_steps}"}
    window = analysis.steady_window(timeline, epoch_steps)
    speed = analysis.steady_samples_per_s(timeline, window, global_batch(workload))
    result |= {
        "samples_per_s": speed,
        "tokens_per_s": speed * tokens_per_sample,
        "first_step_s": analysis.first_step_s(timeline, job.launched),
        "final_metric": analysis.final_metric(timeline, workload.metric),
        "steady_window": window,
    }
    if workload.target:
        result["target"] = workload.target
        result["steps_to_target"] = analysis.steps_to_target(
            timeline, workload.metric, workload.target, workload.higher_is_better
        )
    return result


def phases_of(log: Path, wall_s: float) -> dict:
    """The project's start-up and shut-down phases, and "exit": the rest of the wall time (the workers'
    and the launcher's exit after the last phase)."""
    phases = analysis.project_phases(log.read_text(errors="replace"))
    return {"phases": phases | {"exit": wall_s - sum(phases.values())}} if phases else {}


@dataclass
class Bench:
    """What every run of one bench shares."""

    work: Path
    precision: str
    timeout_s: float
    projects: dict[str, Path]  # model type -> rendered project
    prepared: dict[str, tuple[dict[str, str], int, float]]  # workload -> inputs, epoch steps, tokens/sample
    settle_s: float  # idle seconds before each run (SETTLE_S; none in a quick pass, which measures nothing)


def prepare(workloads: list, work: Path, timeout_s: float, settle_s: float) -> Bench:
    precision = "bf16" if cpu_has_bf16() else "fp32"  # the same for every runner
    projects = {t: render_project(t, work / "projects") for t in sorted({w.model_type for w in workloads})}
    prepared = {}
    for workload in workloads:
        inputs = build_inputs(workload, work / "inputs" / workload.name, projects[workload.model_type])
        samples, tokens_per_sample = training_samples(workload, inputs)
        prepared[workload.name] = (inputs, samples // global_batch(workload), tokens_per_sample)
    return Bench(work, precision, timeout_s, projects, prepared, settle_s)


def run_seed(bench: Bench, workload, runners: list[str], round_: int, seed: int) -> list[dict]:
    """Every runner of ``runners`` meant for ``workload`` once, with training seed ``seed``."""
    inputs, epoch_steps, tokens_per_sample = bench.prepared[workload.name]
    results, timelines = [], {}
    for runner in [name for name in runners if runs.runs_on(name, workload)]:
        time.sleep(bench.settle_s)
        directory = bench.work / "runs" / f"seed{seed}" / workload.name / runner
        load = os.getloadavg()[0]
        project = bench.projects[workload.model_type]
        job, timeline = runs.run(
            runner, workload, inputs, project, bench.precision, seed, directory, bench.timeout_s
        )
        result = {"round": round_, "seed": seed, "workload": workload.name, "runner": runner}
        result |= {"log": str(directory), "load_before": load}
        result |= measure_run(job, timeline, workload, epoch_steps, tokens_per_sample)
        if runs.RUNNERS[runner].is_project and result.get("wall_s"):
            result |= phases_of(directory / "log.txt", result["wall_s"])
        timelines[runner] = (job, timeline)
        results.append(result)
        report_progress(result, job, directory)
    add_time_to_target(results, timelines, workload)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--runners", default=",".join(runs.RUNNERS))
    parser.add_argument("--quick", action="store_true", help="a few steps each: a smoke test, not numbers")
    parser.add_argument("--work-dir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a single run may take")
    parser.add_argument("--report", type=Path, help="only rewrite the .md of a results .json")
    args = parser.parse_args(argv)
    if args.report:
        return rewrite_report(args.report)
    workloads = [WORKLOADS[name] for name in args.workloads.split(",")]
    workloads = [quick(w) for w in workloads] if args.quick else workloads
    runners = args.runners.split(",")
    bench = prepare(workloads, args.work_dir, args.timeout, 0.0 if args.quick else SETTLE_S)
    sizes = f"{args.rounds} round(s), {len(runners)} runners, {len(workloads)} workloads"
    print(f"precision {bench.precision}; {sizes}")
    about = report.machine(bench.precision)  # at the start: the commit the runs measure
    about["command"] = " ".join(["bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.monotonic()
    results: list[dict] = []
    partial = args.work_dir / "results" / "partial.json"  # what is done so far: --report reads it
    partial.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.rounds):
        order = runners[round_ % len(runners) :] + runners[: round_ % len(runners)]
        for workload in workloads:
            for index in range(workload.seeds_per_round):
                seed = SEED + round_ * workload.seeds_per_round + index
                results += run_seed(bench, workload, order, round_, seed)
                partial.write_text(json.dumps({"machine": about, "runs": results}, indent=1))

    about["minutes"] = round((time.monotonic() - started) / 60, 1)
    text = report.markdown(results, workloads, runners, about, args.rounds)
    print("\n" + text)
    everything = {w.name for w in workloads} == set(WORKLOADS) and set(runners) == set(runs.RUNNERS)
    complete = everything and args.rounds >= MIN_ROUNDS and not args.quick
    # Only a complete bench is a result to commit; a partial one must not replace the day's complete one.
    out_dir = REPO / "bench" / "results" if complete else args.work_dir / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = (
        f"{about['date']}-{re.sub(r'[^a-z0-9]+', '-', about['cpu'].lower()).strip('-')}-{about['cores']}cores"
    )
    (out_dir / f"{stem}.md").write_text(text, encoding="utf-8")
    (out_dir / f"{stem}.json").write_text(json.dumps({"machine": about, "runs": results}, indent=1))
    print(f"written: {out_dir / stem}.md and .json")
    return 0 if all(r["wall_s"] is not None for r in results) else 1


def rewrite_report(results_file: Path) -> int:
    """The table of a finished bench again, from its raw numbers (e.g. after a change to report.py)."""
    saved = json.loads(results_file.read_text(encoding="utf-8"))
    runs_done = saved["runs"]
    names = list(dict.fromkeys(run["workload"] for run in runs_done))
    runners = list(dict.fromkeys(run["runner"] for run in runs_done))
    rounds = len({run["round"] for run in runs_done})
    text = report.markdown(runs_done, [WORKLOADS[n] for n in names], runners, saved["machine"], rounds)
    results_file.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)
    return 0


def report_progress(result: dict, job, directory: Path) -> None:
    failure = result.get("error", f"exit {job.returncode}")
    state = "ok" if result["wall_s"] is not None else f"FAILED ({failure}, see {directory / 'log.txt'})"
    name = f"{result['workload']:<8} {result['runner']:<22}"
    print(
        f"round {result['round'] + 1} seed {result['seed']} {name} {job.wall_s:6.1f} s  {state}", flush=True
    )


def add_time_to_target(results: list[dict], timelines: dict, workload) -> None:
    """Time to the reference's final metric of this seed (the plain loop's, or the workload's own
    reference runner's), for every runner of the seed."""
    reference = timelines.get(workload.reference, (None, None))[1]
    if workload.eval_every_steps == 0 or reference is None:
        return
    target = analysis.final_metric(reference, workload.metric)
    for result in results:
        job, timeline = timelines[result["runner"]]
        result["target"] = target
        if timeline is not None:
            result["time_to_target_s"] = analysis.time_to_target(
                timeline, job.launched, workload.metric, target, workload.higher_is_better
            )


if __name__ == "__main__":
    sys.exit(main())
