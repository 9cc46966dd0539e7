"""The bench's table, its targets and the machine it ran on, as Markdown and JSON."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import provenance
from analysis import median
from runs import LABELS
from targets import MISSED, against, by_seed, steps_summary, targets, times_to_target

PACKAGES = ["torch", "transformers", "accelerate", "lightning-fabric", "tokenizers"]


def machine(precision: str) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration):
        memory_kb = 0
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 2**20, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {name: metadata.version(name) for name in PACKAGES},
        "precision": precision,
        "template_commit": provenance.current_commit(),
    }


def _cell(value: float | None, digits: int = 1, suffix: str = "") -> str:
    if value == MISSED:
        return "missed"
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _median(values: list[float] | dict[int, float]) -> float | None:
    values = list(values.values()) if isinstance(values, dict) else values
    return median(values) if values else None


COLUMNS = ("samples_per_s", "tokens_per_s", "wall_s", "first_step_s", "rss0", "rss1", "final_metric")


def workload_table(runs: list[dict], workload: Any, runners: list[str]) -> list[str]:
    metric, base = workload.metric.removeprefix("eval_"), workload.reference
    lines = [
        f"| runner | samples/s | tokens/s | wall s | first step s | peak RSS MiB rank 0 / 1 | {metric} |"
        f" time to target s | samples/s vs {base} | wall vs {base} | first step vs {base} |",
        "|" + " --- |" * 11,
    ]
    name = workload.name
    for runner in runners:
        m = {key: _median(by_seed(runs, name, runner, key)) for key in COLUMNS}
        if m["wall_s"] is None:
            lines.append(f"| {LABELS[runner]} | failed: see its log.txt |" + " |" * 9)
            continue
        times = times_to_target(runs, name, runner)
        missed = sum(value == MISSED for value in times.values())
        target = f"{_cell(_median(times))}{f' ({missed} missed)' if missed else ''}" if times else "n/a"
        speed = _median(against(runs, name, "samples_per_s", runner, base))
        wall = _median(against(runs, name, "wall_s", runner, base))
        start = _median(against(runs, name, "first_step_s", runner, base, difference=True))
        lines.append(
            f"| {LABELS[runner]} | {_cell(m['samples_per_s'])} | {_cell(m['tokens_per_s'], 0)} "
            f"| {_cell(m['wall_s'])} | {_cell(m['first_step_s'], 2)} "
            f"| {_cell(m['rss0'], 0)} / {_cell(m['rss1'], 0)} | {_cell(m['final_metric'], 3)} "
            f"| {target} | {_cell(speed, 3, 'x')} | {_cell(wall, 3, 'x')} | {_cell(start, 2, ' s')} |"
        )
    return lines


def steps_table(runs: list[dict], workload: Any, runners: list[str]) -> list[str]:
    """Sample efficiency: the metric after the epoch over the seeds, and the steps to the target."""
    metric = workload.metric.removeprefix("eval_")
    lines = [
        f"| runner | {metric} after the epoch: median (min - max) | per seed | reached {workload.target} "
        f"| steps to {workload.target}: median | per seed | samples/s |",
        "|" + " --- |" * 7,
    ]
    for runner in runners:
        summary = steps_summary(runs, runner)
        if summary is None:
            lines.append(f"| {LABELS[runner]} | failed: see its log.txt |" + " |" * 5)
            continue
        final, steps = summary["final"], summary["steps"]
        seeds = sorted(final)
        lines.append(
            f"| {LABELS[runner]} | {summary['median']:.3f} ({min(final.values()):.3f} - "
            f"{max(final.values()):.3f}) | {', '.join(f'{final[s]:.2f}' for s in seeds)} "
            f"| {summary['reached']} of {len(seeds)} | {_cell(_median(steps), 0)} "
            f"| {', '.join(_cell(steps[s], 0) for s in seeds)} "
            f"| {_cell(_median(by_seed(runs, 'steps', runner, 'samples_per_s')))} |"
        )
    return lines


def phases_table(runs: list[dict], workloads: list[Any]) -> list[str]:
    """Where the project's wall time goes outside its steps, per workload: the median of each phase over
    the default row's runs (observe/phases.py), beside the plain loop's launch to first step and wall."""
    rows = {}
    for workload in workloads:
        found = [
            r["phases"]
            for r in runs
            if r["workload"] == workload.name and r["runner"] == "project" and r.get("phases")
        ]
        if found:
            rows[workload.name] = {name: median([p[name] for p in found if name in p]) for name in found[0]}
    if not rows:
        return []
    names = list(next(iter(rows.values())))
    lines = [
        "| workload | " + " | ".join(names) + " | plain loop: first step | plain loop: wall |",
        "|" + " --- |" * (len(names) + 3),
    ]
    for name, phases in rows.items():
        plain = [_median(by_seed(runs, name, "plain", key)) for key in ("first_step_s", "wall_s")]
        cells = [_cell(phases.get(phase), 2) for phase in names] + [_cell(value, 2) for value in plain]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def markdown(
    runs: list[dict], workloads: list[Any], runners: list[str], about: dict[str, Any], rounds: int
) -> str:
    packages = ", ".join(f"{name} {version}" for name, version in about["packages"].items())
    loads = [run["load_before"] for run in runs if "load_before" in run]
    load = (
        f" Load average (1 min) before each run: median {median(loads):.2f}, max {max(loads):.2f}."
        if loads
        else ""
    )
    found = targets(runs, [w.name for w in workloads], about["precision"])
    out = [
        f"# Bench results, {about['date']}",
        "",
        f"Machine: {about['cpu']}, {about['cores']} cores, {about['memory_gib']} GiB, {about['os']}; "
        f"Python {about['python']}; {packages}. Template commit {about['template_commit']}.{load}",
        f"Command: `{about.get('command', 'bench/run.py')}`"
        + (f", {about['minutes']} minutes." if "minutes" in about else "."),
        f"Every run: torchrun, 2 gloo processes, OMP_NUM_THREADS=1, precision {about['precision']}, unless "
        f"its row says otherwise. {rounds} interleaved rounds (the runner order rotates each round); "
        "medians over seeds, ratios and differences paired within a seed (one per round; (d) has several).",
        "",
        "## Targets",
        "",
        *[f"- {text}" for text, ok in found if ok is not None],
        "",
        "## Measured settings",
        "",
        *[f"- {text}" for text, ok in found if ok is None],
    ]
    for workload in workloads:
        present = [
            r for r in runners if any(run["workload"] == workload.name and run["runner"] == r for run in runs)
        ]
        table = steps_table if workload.target else workload_table
        out += ["", f"## {workload.title}", "", *table(runs, workload, present)]
    phases = phases_table(runs, workloads)
    if phases:
        title = "## Start-up and shut-down: the generated project's phases, median seconds"
        out += ["", title, "", *phases]
    return "\n".join(out) + "\n"
