"""End to end under real torchrun with 2 gloo processes on CPU: outputs, resume, one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import METRIC, PROJECT, launch_env, read_metrics, run_launch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def test_run_writes_metrics_checkpoints_and_final_model(trained: Path) -> None:
    records = read_metrics(trained)
    train_records = [r for r in records if "loss" in r]
    eval_records = [r for r in records if "eval_loss" in r]
    assert train_records and all({"step", "epoch", "loss"} <= r.keys() for r in train_records)
    assert [r["step"] for r in train_records] == sorted(r["step"] for r in train_records)
    assert len(eval_records) == 2  # one per epoch
    assert all(METRIC in r and r["step"] > 0 for r in eval_records)
    assert eval_records[-1]["epoch"] == 2.0

    checkpoints = sorted((trained / "checkpoints").glob("step-*.pt"))
    assert 1 <= len(checkpoints) <= 3  # checkpoint.keep_last
    assert not list((trained / "checkpoints").glob(".*partial"))
    payload = torch.load(checkpoints[-1], map_location="cpu", weights_only=False)
    assert payload["train_state"]["step"] == eval_records[-1]["step"]
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in payload["model"])
    assert {"optimizer", "scheduler", "scaler", "rng"} <= payload.keys()
    assert len(payload["rng"]) == 2  # one state per rank

    weights = load_file(trained / "final" / "model.safetensors")
    for name, tensor in payload["model"].items():
        if name in weights:
            assert torch.equal(weights[name], tensor), name


def test_only_rank_zero_writes(trained: Path) -> None:
    written = {path.name for path in trained.iterdir()}
    assert (
        {"checkpoints", "config.yaml", "final", "metrics.jsonl"}
        <= written
        <= {
            "cache",
            "checkpoints",
            "config.yaml",
            "final",
            "metrics.jsonl",
        }
    )
    # Had rank 1 written too, every record would appear twice.
    steps = [(r["step"], "eval_loss" in r) for r in read_metrics(trained)]
    assert len(steps) == len(set(steps))


def _final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "final" / "model.safetensors")


def test_killed_run_resumes_to_the_same_weights(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    _, overrides = demo
    common = [*overrides, "train.precision=fp32", "train.epochs=2", "checkpoint.every_steps=4"]
    reference = tmp_path / "uninterrupted"
    assert run_launch([*common, f"output_dir={reference}"]).returncode == 0

    interrupted = tmp_path / "interrupted"
    command = [str(PROJECT / "launch.sh"), *common, f"output_dir={interrupted}"]
    process = subprocess.Popen(
        command,
        env=launch_env(2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not list((interrupted / "checkpoints").glob("step-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # the whole job, as a lost node or an OOM kill would
    process.wait()
    assert not (interrupted / "final").exists(), "the run finished before it could be interrupted"

    resumed = run_launch([*common, f"output_dir={interrupted}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    steps = [r["step"] for r in read_metrics(interrupted) if "loss" in r]
    assert steps == sorted(set(steps)), "records of the killed run were duplicated"
    expected, actual = _final_weights(reference), _final_weights(interrupted)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after resume"


def test_config_error_ends_launch_in_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_launch([f"output_dir={tmp_path}", "train.epoch=3"])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.epoch: unknown config key"), lines
    assert time.monotonic() - started < 60
    assert not list(tmp_path.iterdir())  # nothing written
