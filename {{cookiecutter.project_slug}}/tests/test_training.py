"""End to end under real torchrun with 2 gloo processes on CPU: outputs, resume, one-line errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from conftest import METRIC, read_metrics, run_launch
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


def test_config_error_ends_launch_in_one_line(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_launch([f"output_dir={tmp_path}", "train.epoch=3"])
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.epoch: unknown config key"), lines
    assert time.monotonic() - started < 60
    assert not list(tmp_path.iterdir())  # nothing written
