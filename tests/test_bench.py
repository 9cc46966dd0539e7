"""The bench's arithmetic (fast) and one quick pass of every runner through it (slow).

The bench's numbers are only as good as its definitions, so each one is checked on timelines whose
answers are known: steady-state rates without evaluation time, time to target, paired ratios, and the
peak RSS it reads from outside a real process tree.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from template_helpers import REPO, describe, run

sys.path.insert(0, str(REPO / "bench"))

import analysis  # noqa: E402
import measure  # noqa: E402


def timeline() -> analysis.Timeline:
    """Steps 1..10 at one second each from t=100, with a 5 s evaluation after step 4 (so step 5 ends at
    110, not 105) and one after step 10."""
    steps = {step: 100.0 + step + (5.0 if step > 4 else 0.0) for step in range(1, 11)}
    evals = [
        {"step": 4, "start": 104.0, "end": 109.0, "eval_accuracy": 0.5},
        {"step": 10, "start": 115.0, "end": 116.0, "eval_accuracy": 0.9},
    ]
    return analysis.Timeline(steps, evals)


def test_steady_state_rate_leaves_evaluation_out() -> None:
    line = timeline()
    assert analysis.steady_window(line, epoch_steps=10) == (3, 10)
    assert analysis.steady_samples_per_s(line, (3, 10), samples_per_step=32) == pytest.approx(32.0)


def test_time_to_target_counts_training_only_and_none_when_missed() -> None:
    line = timeline()
    assert analysis.time_to_target(line, 90.0, "eval_accuracy", 0.5, True) == pytest.approx(14.0)
    assert analysis.time_to_target(line, 90.0, "eval_accuracy", 0.8, True) == pytest.approx(20.0)
    assert analysis.time_to_target(line, 90.0, "eval_accuracy", 0.95, True) is None
    assert analysis.time_to_target(line, 90.0, "eval_accuracy", 0.6, False) == pytest.approx(14.0)
    assert analysis.first_step_s(line, 90.0) == pytest.approx(11.0)


def test_project_timeline_reads_metrics_jsonl(tmp_path: Path) -> None:
    records = [
        {"step": 1, "loss": 1.0, "time": 10.0},
        {"step": 4, "loss": 0.9, "time": 13.0},
        {"step": 4, "eval_loss": 0.8, "eval_accuracy": 0.7, "time": 15.0},
        {"step": 8, "loss": 0.7, "time": 19.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    line = analysis.project_timeline(path)
    assert line.steps == {1: 10.0, 4: 13.0, 8: 19.0}
    assert line.evals == [{**records[2], "start": 13.0, "end": 15.0}]
    assert analysis.evaluation_time(line, 0, 8) == pytest.approx(2.0)


def test_paired_values_use_the_rounds_both_have() -> None:
    assert analysis.paired({0: 2.0, 1: 3.0, 2: 9.0}, {0: 1.0, 1: 2.0}) == [2.0, 1.5]
    assert analysis.paired({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}, difference=True) == [1.0, 1.0]


def test_peak_rss_of_each_rank_is_read_from_outside(tmp_path: Path) -> None:
    """A launcher whose child is 'rank 0' (it has RANK, its parent has none) and holds 80 MiB."""
    rank = "x = bytearray(80 << 20); import time; time.sleep(1.5)"
    launcher = (
        "import os, subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {rank!r}], env={{**os.environ, 'RANK': '0'}}, check=True)\n"
    )
    job = measure.run_job(
        [sys.executable, "-c", launcher], {}, tmp_path, tmp_path / "log.txt", timeout_s=60, world_size=1
    )
    assert job.returncode == 0, job.stderr_tail
    assert set(job.peak_rss_mb) == {0}
    assert 80 <= job.peak_rss_mb[0] < 400
    assert job.wall_s >= 1.5


@pytest.mark.slow
def test_every_runner_completes_a_quick_pass(tmp_path: Path) -> None:
    """Each runner on the classification and causal-LM workloads, a few steps each: the bench runs."""
    command = [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--rounds", "1"]
    command += ["--workloads", "fixed,causal", "--work-dir", str(tmp_path)]
    proc = run(command, cwd=REPO, timeout=900)
    assert proc.returncode == 0, describe(proc)
    results = json.loads(next((tmp_path / "results").glob("*.json")).read_text())
    done = {(r["workload"], r["runner"]) for r in results["runs"] if r["returncode"] == 0}
    expected_runners = {"project", "plain", "accelerate", "fabric", "trainer"}
    assert done == {(w, r) for w in ("fixed", "causal") for r in expected_runners}
    report = next((tmp_path / "results").glob("*.md")).read_text()
    assert "(a) steady-state samples/s" in report and "peak RSS" in report
    assert all(r["samples_per_s"] > 0 and r["first_step_s"] > 0 for r in results["runs"])


@pytest.mark.slow
def test_gpu_check_plumbing_runs_on_cpu(tmp_path: Path) -> None:
    """bench/gpu_check.sh renders, builds, launches and reports; --cpu stands in for the GPU here."""
    command = [str(REPO / "bench" / "gpu_check.sh"), "--cpu", "--skip-compile", "--work-dir", str(tmp_path)]
    env = {**os.environ, "PYTHON": sys.executable}
    proc = run(command, cwd=REPO, env=env, timeout=600)
    assert proc.returncode == 0, describe(proc)
    table = (tmp_path / "gpu-check-cpu-plumbing-check-cpu.md").read_text()
    for label in ("bf16", "fsdp2 bf16"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        assert float(row.split("|")[2]) > 0, row
