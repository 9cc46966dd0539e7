"""From timelines to numbers: the same definitions for every runner, pure functions only.

A timeline holds the wall-clock end of optimizer steps (every step for the hand-written runners, the
logged ones for the generated project) and each evaluation's start and end. Evaluation time never counts
as training time; the project's checkpoints do, as the cost of its fault tolerance.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Timeline:
    steps: dict[int, float]  # optimizer step -> Unix time it ended
    evals: list[dict[str, Any]] = field(default_factory=list)  # step, start, end and the metrics


def project_timeline(metrics_file: Path) -> Timeline:
    """The generated project's metrics.jsonl: an evaluation starts when its step's record is written."""
    steps: dict[int, float] = {}
    evals = []
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if any(key.startswith("eval_") for key in record):
            evals.append({**record, "start": steps[record["step"]], "end": record["time"]})
        else:
            steps[record["step"]] = record["time"]
    return Timeline(steps, evals)


PHASE = re.compile(r"(.+?) (-?\d+\.\d+)(?: s)?")


def project_phases(log_text: str) -> dict[str, float]:
    """The project's last "wall time: ..." line (observe/phases.py) as {phase: seconds}, in its order;
    the start-up and end totals are left out (their phases are in)."""
    lines = [line for line in log_text.splitlines() if "wall time: " in line]
    if not lines:
        return {}
    found = {}
    for part in re.split(r"[;(),]", lines[-1].split("wall time: ", 1)[1]):
        match = PHASE.fullmatch(part.strip())
        if match and match[1] not in ("start-up", "end"):
            found[match[1]] = float(match[2])
    return found


def runner_timeline(timeline_file: Path) -> Timeline:
    raw = json.loads(timeline_file.read_text(encoding="utf-8"))
    return Timeline({int(step): t for step, t in raw["steps"]}, raw["evals"])


def evaluation_time(timeline: Timeline, from_step: int, to_step: int) -> float:
    """Seconds spent evaluating after step ``from_step`` and before step ``to_step`` ended."""
    return sum(e["end"] - e["start"] for e in timeline.evals if from_step <= e["step"] < to_step)


def steady_window(timeline: Timeline, epoch_steps: int, warmup_share: float = 0.25) -> tuple[int, int]:
    """(first, last) logged steps bounding the steady state: the first epoch (its ``epoch_steps`` complete
    batches) past its first quarter. No checkpoint of the project falls inside: it saves at epoch ends."""
    logged = sorted(step for step in timeline.steps if step <= epoch_steps)
    start = next(step for step in logged if step >= warmup_share * epoch_steps)
    return start, logged[-1]


def steady_samples_per_s(timeline: Timeline, window: tuple[int, int], samples_per_step: int) -> float:
    first, last = window
    seconds = timeline.steps[last] - timeline.steps[first] - evaluation_time(timeline, first, last)
    return (last - first) * samples_per_step / seconds


def first_step_s(timeline: Timeline, launched: float) -> float:
    return timeline.steps[min(timeline.steps)] - launched


def final_metric(timeline: Timeline, metric: str) -> float:
    return timeline.evals[-1][metric]


def first_reaching(timeline: Timeline, metric: str, target: float, higher_is_better: bool) -> dict | None:
    """The first evaluation whose ``metric`` reached ``target``; None when none did."""
    for evaluation in timeline.evals:
        value = evaluation[metric]
        if (value >= target) if higher_is_better else (value <= target):
            return evaluation
    return None


def time_to_target(
    timeline: Timeline, launched: float, metric: str, target: float, higher_is_better: bool
) -> float | None:
    """Launch to the end of the first step whose evaluation reached ``target``, evaluations excluded;
    None when no evaluation reached it."""
    evaluation = first_reaching(timeline, metric, target, higher_is_better)
    if evaluation is None:
        return None
    step = evaluation["step"]
    return timeline.steps[step] - launched - evaluation_time(timeline, 0, step)


def steps_to_target(timeline: Timeline, metric: str, target: float, higher_is_better: bool) -> int | None:
    """The first evaluated step whose ``metric`` reached ``target``; None when none did."""
    evaluation = first_reaching(timeline, metric, target, higher_is_better)
    return None if evaluation is None else evaluation["step"]


def median(values: list[float]) -> float:
    return statistics.median(values)


def paired(values: dict[int, float], reference: dict[int, float], difference: bool = False) -> list[float]:
    """Per round (the rounds both have): value / reference, or value - reference."""
    rounds = sorted(set(values) & set(reference))
    if difference:
        return [values[r] - reference[r] for r in rounds]
    return [values[r] / reference[r] for r in rounds]
