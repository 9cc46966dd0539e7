"""checkpoint.every_minutes: each rank's clock votes with the preemption vote, and every rank saves after
the same step, once per agreement; in one process, and under torchrun with 2 processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import read_metrics, run_launch
from inprocess import fit

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.launch.preemption import (
    PreemptionWatch,
)
from {{ cookiecutter.package_name }}.loop.checkpoint_clock import (
    CheckpointClock,
)


def saved_steps(output_dir: Path) -> list[int]:
    return sorted(int(path.stem.split("-")[1]) for path in (output_dir / "checkpoints").glob("step-*.pt"))


def epoch_ends(output_dir: Path) -> set[int]:
    """The steps that ended an epoch, which save a checkpoint of their own: how many there are in a run
    depends on the model type's demo data and the number of processes."""
    trained = [record for record in read_metrics(output_dir) if "loss" in record]
    return {record["step"] for record in trained if record["epoch"] == int(record["epoch"]) > 0}


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_is_due_once_the_interval_has_passed_since_any_checkpoint() -> None:
    time = FakeTime()
    clock = CheckpointClock(every_minutes=2, now=time)
    time.now = 119.0
    assert not clock.due()
    time.now = 120.0
    assert clock.due()
    clock.saved(step=7)  # a checkpoint of every_steps or an epoch end restarts the interval too
    assert (clock.saved_step, clock.due()) == (7, False)
    assert not CheckpointClock(every_minutes=0, now=time).due()  # off


def test_the_vote_agrees_one_step_later_and_asks_once() -> None:
    """The vote of a step is read after the next one; the step that saves asks for no second save."""
    watch = PreemptionWatch()
    agreements = []
    for due in [False, True, True, True, False, False]:
        assert not watch.agreed(checkpoint_due=due)
        agreements.append(watch.checkpoint_due)
    assert agreements == [False, False, True, False, True, False]
    watch.settle()


def test_fit_saves_by_the_clock_beside_every_steps(deterministic, tmp_path: Path) -> None:
    """A clock that is always due: a checkpoint every other step (the vote, then the save), with
    checkpoint.every_steps=0; without it, only the last step's."""
    run = [*deterministic, "train.max_steps=7", "checkpoint.every_steps=0", "checkpoint.keep_last=10",
           "data.num_workers=0", "train.epochs=100"]  # fmt: skip
    fit([*run, "checkpoint.every_minutes=1e-9", f"output_dir={tmp_path / 'timed'}"])
    fit([*run, f"output_dir={tmp_path / 'untimed'}"])
    saved = {name: saved_steps(tmp_path / name) for name in ("timed", "untimed")}
    ends = epoch_ends(tmp_path / "untimed")
    assert saved["timed"] == sorted({2, 4, 6, 7} | ends)
    assert saved["untimed"] == sorted({7} | ends)


@pytest.mark.slow
def test_two_processes_save_by_the_clock_after_the_same_steps(deterministic, tmp_path: Path) -> None:
    """Under torchrun a timed checkpoint is a collective (buffers are synced before saving): ranks that
    disagreed on the step would hang or fail; they agree, and the run resumes from what they saved."""
    run = [*deterministic, "train.max_steps=9", "checkpoint.every_steps=0", "checkpoint.keep_last=10",
           "checkpoint.every_minutes=1e-9", "train.epochs=100", f"output_dir={tmp_path}"]  # fmt: skip
    result = run_launch(run)
    assert result.returncode == 0, result.stderr[-3000:]
    assert saved_steps(tmp_path) == sorted({2, 4, 6, 8, 9} | epoch_ends(tmp_path))
    assert [record["step"] for record in read_metrics(tmp_path) if "loss" in record][-1] == 9
