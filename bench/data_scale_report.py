"""The data-scale bench's table and targets, from the numbers ``data_scale.py`` measured."""

from __future__ import annotations

import json
import platform
from pathlib import Path

LABELS = {"today": "today (torch.save cache, rank 0 alone)", "datasets": "datasets (Arrow, parallel map)"}
TARGET_SPEEDUP = 1.6  # preprocessing lines/s against today's
TARGET_RSS_GROWTH_MB = 150  # per rank, from the smallest to the largest data set
TARGET_RERUN_RATIO = 1.2  # cached rerun's time to first step, largest over smallest data set
VERDICT = {True: "PASS", False: "MISS"}
PREFIX = "data-scale-"  # of the file names: provenance tells the kinds of table apart by it


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _launch_table(results: dict) -> list[str]:
    lines = [
        "| lines | implementation | first run: first step s | cached rerun: first step s | "
        "peak RSS MiB rank 0 / 1 (first run) | peak RSS MiB rank 0 / 1 (rerun) | cache MiB | load after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in results["launch"]:
        first, rerun = run["first"], run["rerun"]
        rss = [" / ".join(f"{value:.0f}" for value in part["rss_mb"]) for part in (first, rerun)]
        lines.append(
            f"| {run['lines']:,} | {LABELS[run['implementation']]} | {first['first_step_s']:.1f} | "
            f"{rerun['first_step_s']:.1f} | {rss[0]} | {rss[1]} | {run['cache_mb']:.0f} | {rerun['load']} |"
        )
    return lines


def _preprocess_table(results: dict) -> list[str]:
    lines = [
        "| lines | implementation | processes | seconds | lines/s | vs today | CPU s (all processes) "
        "| load after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    today = {
        run["lines"]: run["lines_per_s"] for run in results["preprocess"] if run["implementation"] == "today"
    }
    for run in results["preprocess"]:
        ratio = run["lines_per_s"] / today[run["lines"]]
        lines.append(
            f"| {run['lines']:,} | {LABELS[run['implementation']]} | {run['processes']} | "
            f"{run['seconds']:.1f} | {run['lines_per_s']:,.0f} | {ratio:.2f}x | {run['cpu_s']:.1f} | "
            f"{run['load']} |"
        )
    return lines


def _speedups(results: dict) -> list[str]:
    runs = results["preprocess"]
    today = {run["lines"]: run["lines_per_s"] for run in runs if run["implementation"] == "today"}
    lines = []
    for size in sorted(today):
        best = max(
            run["lines_per_s"] for run in runs if run["lines"] == size and run["implementation"] != "today"
        )
        ratio = best / today[size]
        target = f"target >= {TARGET_SPEEDUP}x"
        lines.append(
            f"- {VERDICT[ratio >= TARGET_SPEEDUP]} preprocessing at {size:,} lines: {ratio:.2f}x ({target})"
        )
    return lines


def targets(results: dict) -> list[str]:
    ours = [run for run in results["launch"] if run["implementation"] == "datasets"]
    small, large = min(ours, key=lambda run: run["lines"]), max(ours, key=lambda run: run["lines"])
    scale = f"from {small['lines']:,} to {large['lines']:,} lines"
    lines = _speedups(results)
    for part in ("first", "rerun"):
        growth = [large[part]["rss_mb"][rank] - small[part]["rss_mb"][rank] for rank in range(2)]
        ranks = f"rank 0 {growth[0]:+.0f} MiB, rank 1 {growth[1]:+.0f} MiB"
        passed = max(growth) <= TARGET_RSS_GROWTH_MB
        lines.append(
            f"- {VERDICT[passed]} peak RSS {scale} ({part} run): {ranks} (target <= {TARGET_RSS_GROWTH_MB})"
        )
    for reference in ("rerun", "first"):
        ratio = large["rerun"]["first_step_s"] / small[reference]["first_step_s"]
        what = f"{ratio:.2f}x that of {small['lines']:,} lines' {reference} run"
        passed = VERDICT[ratio <= TARGET_RERUN_RATIO]
        lines.append(
            f"- {passed} cached rerun at {large['lines']:,} lines: first step {what} (target <= 1.2x)"
        )
    return lines


def write(results: dict, directory: Path, date: str) -> Path:
    cores = len(Path("/proc/cpuinfo").read_text().split("processor\t:")) - 1
    cpu = cpu_name()
    slug = "-".join(cpu.lower().replace("(r)", "").split()[:3])
    name = f"{PREFIX}{date}-{slug}-{cores}cores"
    text = "\n".join(
        [
            f"# Data-scale bench, {date}: {cpu}, {cores} cores",
            "",
            f"Template commit {results['template_commit']}. Today's implementation: the template at "
            f"{results['baseline']}. Load average (1/5/15 min) before: {results['load_before']}, after: "
            f"{results['load_after']}.",
            "",
            "## Launch, 2 processes, 3 training steps",
            "",
            *_launch_table(results),
            "",
            "## Preprocessing alone (one process's build_data, world size 1)",
            "",
            *_preprocess_table(results),
            "",
            "## Targets",
            "",
            *targets(results),
            "",
        ]
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.md").write_text(text, encoding="utf-8")
    (directory / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(text)
    return directory / f"{name}.md"
