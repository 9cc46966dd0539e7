"""The bench's targets, each PASS or MISS, and the paired comparisons the READMEs quote.

Values are paired within a seed (a round of every workload but the several-seed one): the same data,
the same training seed, run back to back. A run that never reached a target counts as a miss (an
infinite time), never as a round left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis import median, paired
from runs import LABELS, PEERS

MISSED = math.inf


def by_seed(runs: list[dict], workload: str, runner: str, key: str) -> dict[int, float]:
    return {
        run.get("seed", run["round"]): run[key]
        for run in runs
        if run["workload"] == workload and run["runner"] == runner and run.get(key) is not None
    }


def against(
    runs: list[dict], workload: str, key: str, runner: str, reference: str, difference: bool = False
) -> list[float]:
    """Per seed: ``runner``'s value of ``key`` over (or minus) ``reference``'s."""
    return paired(by_seed(runs, workload, runner, key), by_seed(runs, workload, reference, key), difference)


def times_to_target(runs: list[dict], workload: str, runner: str) -> dict[int, float]:
    """Per seed that had a target: the runner's time to it, MISSED where it never got there (a failed
    run included)."""
    return {
        run.get("seed", run["round"]): run.get("time_to_target_s") or MISSED
        for run in runs
        if run["workload"] == workload and run["runner"] == runner and "target" in run
    }


@dataclass
class BestPeer:
    ratios: list[float]  # per seed: the project's time over the fastest peer's (inf: the project missed)
    winners: list[str]  # the fastest peer of each seed
    misses: int  # seeds in which the project never reached the target


def time_to_target_vs_best_peer(runs: list[dict]) -> BestPeer:
    """Per seed: the project's time to target over the fastest of every peer configuration the bench
    ran, opt-in flags included (the plain loop reaches its own final metric, so some peer always does)."""
    project = times_to_target(runs, "variable", "project")
    peers = {peer: times_to_target(runs, "variable", peer) for peer in PEERS}
    found = BestPeer([], [], 0)
    for seed in sorted(project):
        reached = {peer: times[seed] for peer, times in peers.items() if times.get(seed, MISSED) < MISSED}
        if not reached:
            continue  # no peer ran to the target this seed: nothing to compare with
        winner = min(reached, key=reached.__getitem__)
        found.ratios.append(project[seed] / reached[winner])
        found.winners.append(LABELS[winner])
        found.misses += project[seed] == MISSED
    return found


def steps_summary(runs: list[dict], runner: str) -> dict[str, Any] | None:
    """A runner's sample efficiency on "steps": final metric per seed, and steps to the target."""
    final = by_seed(runs, "steps", runner, "final_metric")
    if not final:
        return None
    steps = {
        run.get("seed", run["round"]): run.get("steps_to_target") or MISSED
        for run in runs
        if run["workload"] == "steps" and run["runner"] == runner and "final_metric" in run
    }
    return {
        "final": final,
        "median": median(list(final.values())),
        "steps": steps,
        "reached": sum(value < MISSED for value in steps.values()),
    }


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return "missed" if value == MISSED else f"{value:.{digits}f}"


class Checks:
    """Target and comparison lines, in the order they are added."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, bool | None]] = []

    def target(self, text: str, values: list[float], holds, shown: str = "") -> None:
        value = median(values) if values else None
        ok = value is not None and holds(value)
        shown = shown or ", ".join(_fmt(v) for v in values)
        self.lines.append((f"{'PASS' if ok else 'MISS'}  {text} = {_fmt(value)} (per seed: {shown})", ok))

    def compare(self, text: str, values: list[float]) -> None:
        if values:
            shown = ", ".join(_fmt(v) for v in values)
            self.lines.append((f"{text} = {_fmt(median(values))} (per seed: {shown})", None))


def targets(runs: list[dict], names: list[str], precision: str) -> list[tuple[str, bool | None]]:
    """The targets (PASS/MISS: medians of paired per-seed values) and the measured comparisons (None)."""
    checks = Checks()
    if "fixed" in names:
        ratios = against(runs, "fixed", "samples_per_s", "project", "plain")
        checks.target(
            "(a) steady-state samples/s, target >= 0.98: project / plain loop", ratios, lambda v: v >= 0.98
        )
    if "causal" in names:
        ratios = against(runs, "causal", "samples_per_s", "project", "plain")
        text = "(c) steady-state samples/s, target >= 0.98: project / plain loop"
        checks.target(text, ratios, lambda v: v >= 0.98)
    if "tagging" in names:
        ratios = against(runs, "tagging", "samples_per_s", "project", "plain")
        text = "(h) steady-state samples/s, target >= 0.98: project / plain loop"
        checks.target(text, ratios, lambda v: v >= 0.98)
    if "seq2seq" in names:
        ratios = against(runs, "seq2seq", "samples_per_s", "project", "plain")
        text = "(i) steady-state samples/s, target >= 0.98: project / plain loop"
        checks.target(text, ratios, lambda v: v >= 0.98)
        trainer = against(runs, "seq2seq", "samples_per_s", "project", "trainer")
        checks.compare("(i) samples/s: project / transformers Seq2SeqTrainer", trainer)
    if "variable" in names:
        best = time_to_target_vs_best_peer(runs)
        shown = ", ".join(f"{_fmt(r)} vs {w}" for r, w in zip(best.ratios, best.winners, strict=True))
        text = (
            "(b) time to the plain loop's final accuracy, target <= 0.8: project / best peer (every peer "
            f"configuration; the project missed the target in {best.misses} of {len(best.ratios)} seeds)"
        )
        checks.target(text, best.ratios, lambda v: v <= 0.8, shown)
        ratios = against(runs, "variable", "samples_per_s", "project", "project-random")
        text = "(b) samples/s with length grouping, target >= 2.5: project / project with random batches"
        checks.target(text, ratios, lambda v: v >= 2.5)
    if "steps" in names:
        grouped, random = steps_summary(runs, "project"), steps_summary(runs, "project-random")
        gap = [] if grouped is None or random is None else [grouped["median"] - random["median"]]
        text = (
            "(d) accuracy after one epoch, target >= -0.02: median of the project (grouped) - median with "
            "random batches"
        )
        checks.target(text, gap, lambda v: v >= -0.02, _fmt(gap[0]) if gap else "-")
    for name in names:
        if not by_seed(runs, name, "plain", "first_step_s"):
            continue  # (d) and (e) run no plain loop
        differences = against(runs, name, "first_step_s", "project", "plain", difference=True)
        text = f"launch to first step on {name}, target <= +1 s: project - plain loop (s)"
        checks.target(text, differences, lambda v: v <= 1.0)
    if "short" in names:
        ratios = against(runs, "short", "wall_s", "project", "plain")
        text = "(g) a short job's wall time, launch to exit, target <= 1.05: project / plain loop"
        checks.target(text, ratios, lambda v: v <= 1.05)
    for name in names:
        ratios = paired(by_seed(runs, name, "project", "rss0"), by_seed(runs, name, "project", "rss1"))
        checks.target(
            f"peak RSS on {name}, target <= 1.05: project rank 0 / rank 1", ratios, lambda v: v <= 1.05
        )
    if "sft" in names:
        lora_sft(runs, checks)
    settings(runs, checks, precision)
    return checks.lines


def lora_sft(runs: list[dict], checks: Checks) -> None:
    """(f): the project against the transformers Trainer with peft, the reference SFT stack."""
    stack = "project / Trainer with peft on (f)"
    speed = against(runs, "sft", "samples_per_s", "project", "trainer")
    checks.target(f"(f) samples/s, target >= 0.98: {stack}", speed, lambda v: v >= 0.98)
    finals = [by_seed(runs, "sft", runner, "final_metric") for runner in ("project", "trainer")]
    if all(finals):
        ratio = [median(list(finals[0].values())) / median(list(finals[1].values()))]
        shown = f"medians over {len(finals[0])} and {len(finals[1])} seeds"
    else:
        ratio, shown = [], "-"
    checks.target(f"(f) final eval loss, target <= 1.01: {stack}", ratio, lambda v: v <= 1.01, shown)
    project, trainer = (times_to_target(runs, "sft", runner) for runner in ("project", "trainer"))
    ratios = [project[seed] / trainer[seed] for seed in project if trainer.get(seed, MISSED) < MISSED]
    text = f"(f) time to the Trainer's final eval loss, target <= 0.8: {stack} (a miss counts as never)"
    checks.target(text, ratios, lambda v: v <= 0.8)
    memory = against(runs, "sft", "rss0", "project", "trainer")
    checks.target(f"(f) peak RSS of rank 0, target <= 1.1: {stack}", memory, lambda v: v <= 1.1)


def settings(runs: list[dict], checks: Checks, precision: str) -> None:
    """The measurements behind the project's defaults, as paired samples/s ratios."""
    speed = "samples_per_s"
    one_process = "1 process: OMP_NUM_THREADS=cores / OMP_NUM_THREADS=1, samples/s on (e)"
    checks.compare(
        one_process, against(runs, "threads", speed, "project-1proc-cores", "project-1proc-1thread")
    )
    two_processes = "2 processes x 1 thread / 1 process x 1 thread, samples/s on (e)"
    checks.compare(two_processes, against(runs, "threads", speed, "project", "project-1proc-1thread"))
    for name in ("fixed", "variable"):
        workers = f"data.num_workers=2 / 0 (the CPU default), samples/s on {name}"
        checks.compare(workers, against(runs, name, speed, "project-workers", "project"))
    for name in ("fixed", "causal"):
        malloc = f"launch.sh's malloc thresholds / glibc's defaults, samples/s on {name}"
        checks.compare(malloc, against(runs, name, speed, "project", "project-glibc-malloc"))
    bf16, fp32 = (
        ("plain", "plain-other-precision") if precision == "bf16" else ("plain-other-precision", "plain")
    )
    checks.compare(
        "bf16 autocast / fp32, samples/s of the plain loop on fixed",
        against(runs, "fixed", speed, bf16, fp32),
    )
