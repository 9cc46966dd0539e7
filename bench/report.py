"""The bench's table, its targets and the machine it ran on, as Markdown and JSON."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from analysis import median, paired
from runs import LABELS, PEERS

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
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 2**20, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {name: metadata.version(name) for name in PACKAGES},
        "precision": precision,
        "template_commit": commit or "unknown",
    }


def by_round(runs: list[dict], workload: str, runner: str, key: str) -> dict[int, float]:
    return {
        run["round"]: run[key]
        for run in runs
        if run["workload"] == workload and run["runner"] == runner and run.get(key) is not None
    }


def against(
    runs: list[dict], workload: str, key: str, runner: str, reference: str, difference: bool = False
) -> list[float]:
    """Per round: ``runner``'s value of ``key`` over (or minus) ``reference``'s."""
    return paired(by_round(runs, workload, runner, key), by_round(runs, workload, reference, key), difference)


def _cell(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _median(values: list[float] | dict[int, float]) -> float | None:
    values = list(values.values()) if isinstance(values, dict) else values
    return median(values) if values else None


COLUMNS = ("samples_per_s", "tokens_per_s", "wall_s", "first_step_s", "rss0", "rss1", "final_metric")


def workload_table(runs: list[dict], workload: Any, runners: list[str]) -> list[str]:
    metric = workload.metric.removeprefix("eval_")
    lines = [
        f"| runner | samples/s | tokens/s | wall s | first step s | peak RSS MiB rank 0 / 1 | {metric} |"
        " time to target s | samples/s vs plain | wall vs plain | first step vs plain |",
        "|" + " --- |" * 11,
    ]
    name = workload.name
    for runner in runners:
        m = {key: _median(by_round(runs, name, runner, key)) for key in COLUMNS}
        if m["wall_s"] is None:
            lines.append(f"| {LABELS[runner]} | failed: see its log.txt |" + " |" * 9)
            continue
        target = _median(by_round(runs, name, runner, "time_to_target_s"))
        speed = _median(against(runs, name, "samples_per_s", runner, "plain"))
        wall = _median(against(runs, name, "wall_s", runner, "plain"))
        start = _median(against(runs, name, "first_step_s", runner, "plain", difference=True))
        lines.append(
            f"| {LABELS[runner]} | {_cell(m['samples_per_s'])} | {_cell(m['tokens_per_s'], 0)} "
            f"| {_cell(m['wall_s'])} | {_cell(m['first_step_s'], 2)} "
            f"| {_cell(m['rss0'], 0)} / {_cell(m['rss1'], 0)} | {_cell(m['final_metric'], 3)} "
            f"| {_cell(target) if workload.eval_every_steps else 'n/a'} "
            f"| {_cell(speed, 3, 'x')} | {_cell(wall, 3, 'x')} | {_cell(start, 2, ' s')} |"
        )
    return lines


def time_to_target_vs_best_peer(runs: list[dict]) -> tuple[list[float], list[str]]:
    """Per round: the project's time to target over the fastest peer's, and that peer's name."""
    project = by_round(runs, "variable", "project", "time_to_target_s")
    ratios, winners = [], []
    for round_ in sorted(project):
        reached = {
            peer: by_round(runs, "variable", peer, "time_to_target_s")[round_]
            for peer in PEERS
            if round_ in by_round(runs, "variable", peer, "time_to_target_s")
        }
        if reached:
            winner = min(reached, key=reached.get)
            ratios.append(project[round_] / reached[winner])
            winners.append(LABELS[winner])
    return ratios, winners


def targets(runs: list[dict], workloads: list[Any]) -> list[tuple[str, bool]]:
    """The issue's four targets, each a line and whether it holds (medians of paired per-round values)."""
    found = []

    def check(text: str, values: list[float], holds, rounds: str = "") -> None:
        value = _median(values)
        ok = value is not None and holds(value)
        shown = rounds or ", ".join(f"{v:.3f}" for v in values)
        found.append((f"{'PASS' if ok else 'MISS'}  {text} = {_cell(value, 3)} (rounds: {shown})", ok))

    names = [w.name for w in workloads]
    if "fixed" in names:
        ratios = against(runs, "fixed", "samples_per_s", "project", "plain")
        check("(a) steady-state samples/s, target >= 0.98: project / plain loop", ratios, lambda v: v >= 0.98)
    if "variable" in names:
        ratios, winners = time_to_target_vs_best_peer(runs)
        shown = ", ".join(f"{r:.3f} vs {w}" for r, w in zip(ratios, winners, strict=True))
        text = "(b) time to the plain loop's final accuracy, target <= 0.8: project / best peer"
        check(text, ratios, lambda v: v <= 0.8, shown)
    for name in names:
        differences = against(runs, name, "first_step_s", "project", "plain", difference=True)
        text = f"launch to first step on {name}, target <= +1 s: project - plain loop (s)"
        check(text, differences, lambda v: v <= 1.0)
    for name in names:
        ratios = paired(by_round(runs, name, "project", "rss0"), by_round(runs, name, "project", "rss1"))
        check(f"peak RSS on {name}, target <= 1.05: project rank 0 / rank 1", ratios, lambda v: v <= 1.05)
    return found


def markdown(
    runs: list[dict], workloads: list[Any], runners: list[str], about: dict[str, Any], rounds: int
) -> str:
    packages = ", ".join(f"{name} {version}" for name, version in about["packages"].items())
    out = [
        f"# Bench results, {about['date']}",
        "",
        f"Machine: {about['cpu']}, {about['cores']} cores, {about['memory_gib']} GiB, {about['os']}; "
        f"Python {about['python']}; {packages}. Template commit {about['template_commit']}.",
        f"Every run: torchrun, 2 gloo processes, OMP_NUM_THREADS=1, precision {about['precision']}. "
        f"{rounds} interleaved rounds (the runner order rotates each round); medians over rounds, "
        "ratios and differences paired within a round.",
        "",
        "## Targets",
        "",
        *[f"- {text}" for text, _ in targets(runs, workloads)],
    ]
    for workload in workloads:
        present = [
            r for r in runners if any(run["workload"] == workload.name and run["runner"] == r for run in runs)
        ]
        out += ["", f"## {workload.title}", "", *workload_table(runs, workload, present)]
    return "\n".join(out) + "\n"
