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
import former_layout  # noqa: E402
import measure  # noqa: E402
import provenance  # noqa: E402
import run as bench_run  # noqa: E402
import runs  # noqa: E402
import targets  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


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


def test_the_projects_phase_line_is_read_into_seconds_and_the_rest_of_the_wall_is_exit(
    tmp_path: Path,
) -> None:
    line = (
        "12:00:01 wall time: launcher 1.50 s; start-up 4.25 s (python and imports 3.00, process group 0.25, "
        "longest-batch probe 1.00); training 10.00 s; end 0.75 s (final/ 0.50, last checkpoint 0.25)"
    )
    log = tmp_path / "log.txt"
    log.write_text(f"12:00:00 wall time: launcher 9.00 s\n{line}\n12:00:02 done\n")  # the last line counts
    phases = analysis.project_phases(log.read_text())
    assert phases == {
        "launcher": 1.5,
        "python and imports": 3.0,
        "process group": 0.25,
        "longest-batch probe": 1.0,
        "training": 10.0,
        "final/": 0.5,
        "last checkpoint": 0.25,
    }
    assert bench_run.phases_of(log, wall_s=17.0)["phases"]["exit"] == pytest.approx(0.5)
    assert analysis.project_phases("no such line") == {}


def test_every_workload_with_a_reference_is_held_to_a_target() -> None:
    """(c) and (f) by samples/s, (f) by loss (medians over seeds), time to target and memory, (g) by wall."""

    def result(workload: str, runner: str, seed: int, **values: float | None) -> dict:
        return {"round": 0, "seed": seed, "workload": workload, "runner": runner, **values}

    runs = [
        result("causal", "project", 1, samples_per_s=99.0),
        result("causal", "plain", 1, samples_per_s=100.0),
    ]
    runs += [result("short", "project", s, wall_s=w) for s, w in ((1, 10.6), (2, 11.0), (3, 10.0))]
    runs += [result("short", "plain", s, wall_s=10.0) for s in (1, 2, 3)]
    finals = [(1.0, 1.0), (1.2, 1.0), (1.02, 1.0), (0.9, 1.0), (5.0, 1.0)]  # medians 1.02 and 1.0
    for seed, (mine, theirs) in enumerate(finals):
        reached = None if seed == 4 else 8.0  # a miss counts as never, not as a seed left out
        runs += [
            result("sft", "project", seed, final_metric=mine, samples_per_s=120.0, rss0=800.0)
            | {"target": theirs, "time_to_target_s": reached},
            result("sft", "trainer", seed, final_metric=theirs, samples_per_s=100.0, rss0=1000.0)
            | {"target": theirs, "time_to_target_s": 10.0},
        ]
    lines = [text for text, ok in targets.targets(runs, ["causal", "short", "sft"], "fp32") if ok is not None]

    def verdict(start: str) -> str:
        return next(text for text in lines if text[6:].startswith(start))[:4]

    assert verdict("(c) steady-state samples/s") == "PASS"  # 0.99
    assert verdict("(g) a short job's wall time") == "MISS"  # the median of 1.06, 1.10 and 1.00
    assert verdict("(f) samples/s") == "PASS"  # 1.2
    assert verdict("(f) final eval loss") == "MISS"  # 1.02, though the project won 2 of 5 seeds
    assert verdict("(f) time to the Trainer's final eval loss") == "PASS"  # 0.8, 0.8, 0.8, 0.8, never
    assert verdict("(f) peak RSS of rank 0") == "PASS"  # 0.8


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


def variable_run(seed: int, runner: str, time_to_target: float | None, **more: float) -> dict:
    """A run of (b) in the shape run.py records: it had a target; None: it never reached it."""
    run = {"round": seed, "seed": seed, "workload": "variable", "runner": runner, "target": 1.0}
    return run | {"time_to_target_s": time_to_target} | more


def test_best_peer_is_the_fastest_of_every_peer_configuration_opt_in_flags_included() -> None:
    runs = [
        variable_run(0, "project", 12.0),
        variable_run(0, "fabric", 24.0),
        variable_run(0, "plain", 25.0),
        variable_run(0, "trainer-grouped", 12.5),  # the Trainer with its one documented flag
    ]
    best = targets.time_to_target_vs_best_peer(runs)
    assert best.winners == ["Trainer, group_by_length (opt-in)"]
    assert best.ratios == [pytest.approx(12.0 / 12.5)]
    assert best.misses == 0


def test_a_seed_in_which_the_project_never_reached_the_target_counts_as_a_miss() -> None:
    runs = [variable_run(0, "project", 10.0), variable_run(0, "plain", 20.0)]
    runs += [variable_run(1, "project", None), variable_run(1, "plain", 20.0)]
    runs += [{**variable_run(2, "project", None), "wall_s": None}, variable_run(2, "plain", 20.0)]  # failed
    runs += [variable_run(3, "project", 5.0), variable_run(3, "plain", 20.0)]
    best = targets.time_to_target_vs_best_peer(runs)
    assert best.ratios == [0.5, targets.MISSED, targets.MISSED, 0.25]
    assert best.misses == 2
    lines = dict(targets.targets(runs, ["variable"], "fp32"))
    line = next(text for text in lines if text.startswith(("PASS", "MISS")) and "(b) time to" in text)
    assert line.startswith("MISS") and "missed the target in 2 of 4 seeds" in line
    assert "= missed (per seed: 0.500 vs plain DDP loop, missed vs" in line


def test_sample_efficiency_compares_medians_over_seeds_and_counts_steps_to_target() -> None:
    def steps_run(seed: int, runner: str, final: float, steps: int | None) -> dict:
        run = {"round": 0, "seed": seed, "workload": "steps", "runner": runner, "target": 0.9}
        return run | {"final_metric": final, "steps_to_target": steps}

    runs = [steps_run(s, "project", f, n) for s, f, n in ((1, 0.75, None), (2, 1.0, 96), (3, 0.93, 112))]
    runs += [
        steps_run(s, "project-random", f, n) for s, f, n in ((1, 1.0, 80), (2, 0.96, 96), (3, 0.5, None))
    ]
    grouped = targets.steps_summary(runs, "project")
    assert grouped is not None
    assert grouped["median"] == 0.93 and grouped["reached"] == 2
    assert grouped["steps"] == {1: targets.MISSED, 2: 96, 3: 112}
    line = next(text for text, _ in targets.targets(runs, ["steps"], "fp32") if "(d)" in text)
    assert line.startswith("MISS") and "= -0.030" in line
    runs.append(steps_run(4, "project", 1.0, 64))  # the median moves to 0.965, above random's 0.96
    line = next(text for text, _ in targets.targets(runs, ["steps"], "fp32") if "(d)" in text)
    assert line.startswith("PASS") and "= 0.005" in line


def test_every_results_table_names_the_commit_whose_measured_code_is_head() -> None:
    """A committed table is evidence only for the code it ran: the bench, the training loop, the data and
    sampling code, launch.sh. Once any of that changes, the bench is run again (or the table goes)."""
    tables = sorted((REPO / "bench" / "results").glob("*.md"))
    if provenance.current_commit() == "unknown":
        pytest.skip("not a git checkout: no history to compare with")
    for table in tables:
        named = provenance.named_commit(table.read_text(encoding="utf-8"))
        assert named is not None, f"{table.name} names no template commit"
        commit, dirty = named
        assert not dirty, f"{table.name} measured uncommitted code (commit {commit}+dirty)"
        changed = provenance.changed_since(commit, table.name)
        assert not changed, f"{table.name} measured {commit}; since then changed: {', '.join(changed)}"


def test_the_stale_table_check_sees_a_change_of_measured_code() -> None:
    if provenance.current_commit() == "unknown":
        pytest.skip("not a git checkout: no history to compare with")
    first = run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=REPO).stdout.split()[0]
    assert "bench/run.py" in provenance.changed_since(first)
    # Each kind of table follows its own bench's code, and the project code all of them run.
    assert "bench/data_scale.py" not in provenance.changed_since(first, "2026-01-01-cpu-2cores.md")
    assert "bench/data_scale.py" in provenance.changed_since(first, "data-scale-2026-01-01-cpu.md")
    assert "bench/run.py" not in provenance.changed_since(first, "data-scale-2026-01-01-cpu.md")
    sampling = "{{cookiecutter.__project_dir}}/src/{{cookiecutter.package_name}}/data/sampling.py"
    for table in ("2026-01-01-cpu-2cores.md", "data-scale-2026-01-01-cpu.md", "gpu-check-h100.md"):
        assert sampling in provenance.changed_since(first, table)
    causal = "{{cookiecutter.__project_dir}}/model_types/causal-lm/src/{{cookiecutter.package_name}}"
    causal_task = f"{causal}/model_type/task.py"
    assert causal_task in provenance.changed_since(first, "2026-01-01-cpu-2cores.md")
    assert causal_task not in provenance.changed_since(first, "data-scale-2026-01-01-cpu.md")
    assert provenance.named_commit("... Template commit 1a2b3c4+dirty. Load") == ("1a2b3c4", True)
    assert provenance.named_commit("no commit here") is None


OLD_PACKAGE = "{{cookiecutter.__project_dir}}/src/{{cookiecutter.package_name}}"
OLD_TRAINER = """\"\"\"The loop.\"\"\"
from .data import to_device
from .log import log

STEP = 1


def step(batch):
    \"\"\"One step.\"\"\"
    return to_device(batch, "python -m {package}.launcher")
"""
MOVED_TRAINER = """\"\"\"The loop, now in loop/.\"\"\"
from ..data.loader import to_device
from ..observe.log import log

STEP = 1


def step(batch):
    return to_device(batch, "python -m {package}.launch.launcher")
"""


def test_code_that_only_moved_is_the_code_a_table_measured() -> None:
    """Moved files, rewritten imports and docstrings, and old module paths in strings and in launch.sh
    are the same code; one changed definition, wherever it moved, is not."""
    old = {
        f"{OLD_PACKAGE}/trainer.py": OLD_TRAINER,
        "launch.sh": "python -m {{ cookiecutter.package_name }}.launcher  # (launch_status.py)\n",
    }
    new = {
        f"{OLD_PACKAGE}/loop/trainer.py": MOVED_TRAINER,
        "launch.sh": "python -m {{ cookiecutter.package_name }}.launch.launcher  # (launch/status.py)\n",
    }
    assert former_layout.new_path(f"{OLD_PACKAGE}/trainer.py") == f"{OLD_PACKAGE}/loop/trainer.py"
    assert former_layout.changed_files(old, new) == []
    trainer, step = f"{OLD_PACKAGE}/loop/trainer.py", f"{OLD_PACKAGE}/loop/step.py"
    assert former_layout.changed_files(old, {**new, trainer: MOVED_TRAINER.replace("1", "2")}) == [trainer]
    assert former_layout.changed_files(old, {**new, trainer: "", step: MOVED_TRAINER}) == []
    twice = {**new, trainer: "STEP = 1\n", step: MOVED_TRAINER}  # STEP is defined twice now
    assert former_layout.changed_files(old, twice) == [step, trainer]
    script = {**new, "launch.sh": new["launch.sh"].replace("launch.launcher", "launch.launcher --fast")}
    assert former_layout.changed_files(old, script) == ["launch.sh"]


@pytest.mark.slow
@pytest.mark.expected_s(340)
def test_every_runner_completes_a_quick_pass(tmp_path: Path) -> None:
    """Every runner on every workload it is meant for, a few steps each: the bench runs."""
    command = [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--rounds", "1"]
    command += ["--work-dir", str(tmp_path)]
    proc = run(command, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, describe(proc)
    results = json.loads(next((tmp_path / "results").glob("*.json")).read_text())
    done = {(r["workload"], r["runner"]) for r in results["runs"] if r["returncode"] == 0}
    expected = {
        (name, runner)
        for name, workload in WORKLOADS.items()
        for runner in runs.RUNNERS
        if runs.runs_on(runner, workload)
    }
    assert done == expected
    report = next((tmp_path / "results").glob("*.md")).read_text()
    assert "(a) steady-state samples/s" in report and "peak RSS" in report and "(d) accuracy" in report
    assert "1 process: OMP_NUM_THREADS=cores / OMP_NUM_THREADS=1, samples/s on (e) = " in report
    assert all(r["samples_per_s"] > 0 and r["first_step_s"] > 0 for r in results["runs"])


@pytest.mark.slow
@pytest.mark.expected_s(12)
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
