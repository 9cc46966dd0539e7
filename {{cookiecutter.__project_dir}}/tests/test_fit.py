"""The loop in one process, without torchrun: train, checkpoint, stop, resume, in seconds.

The slow tests prove the same under real torchrun; this one catches a broken loop in the fast tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import read_metrics
from inprocess import StopAfter, fit
from weights import assert_same_weights

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.launch.preemption import (
    Preempted,
)

SHORT_RUN = ["train.max_steps=4", "checkpoint.every_steps=2", "train.log_every_steps=1", "data.num_workers=0"]


def test_fit_checkpoints_and_resumes_to_the_same_weights(deterministic, tmp_path: Path) -> None:
    run = [*deterministic, *SHORT_RUN]
    results = fit([*run, f"output_dir={tmp_path / 'straight'}"])
    assert set(results) >= {"step", "eval_loss"} and results["step"] == 4

    with pytest.raises(Preempted) as preempted:
        fit([*run, f"output_dir={tmp_path / 'resumed'}"], StopAfter(3))
    step = preempted.value.step
    assert step == 3
    assert (tmp_path / "resumed" / "checkpoints" / f"step-{step:08d}.pt").is_file()
    assert not (tmp_path / "resumed" / "final").exists()

    fit([*run, f"output_dir={tmp_path / 'resumed'}"])
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    steps = [record["step"] for record in read_metrics(tmp_path / "resumed") if "loss" in record]
    assert steps == [1, 2, 3, 4]
