"""End to end under real torchrun with 2 gloo processes on CPU: outputs, resume, one-line errors."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, PROJECT, launch_env, read_metrics, run_launch
from safetensors.torch import load_file
from weights import final_weights

pytestmark = pytest.mark.slow


def test_run_writes_metrics_checkpoints_and_final_model(trained: Path) -> None:
    records = read_metrics(trained)
    train_records = [r for r in records if "loss" in r]
    eval_records = [r for r in records if "eval_loss" in r]
    assert train_records and all({"step", "epoch", "loss"} <= r.keys() for r in train_records)
    for record in train_records:  # at least one token per sample (the two rates are rounded apart)
        assert record["samples_per_s"] > 0 and record["tokens_per_s"] >= 0.99 * record["samples_per_s"]
    assert all(0 <= r["data_wait_share"] <= 1 and 0 < r["mfu"] < 1 for r in train_records)
    assert train_records[0]["step"] == 1  # the first step is logged: loss sanity check, start-up time
    assert [r["step"] for r in train_records] == sorted(r["step"] for r in train_records)
    times = [r["time"] for r in records]
    assert times == sorted(times) and times[-1] - times[0] < 600
    assert len(eval_records) == 2  # one per epoch
    assert all(METRIC in r and r["step"] > 0 for r in eval_records)
    assert eval_records[-1]["epoch"] == 2.0

    checkpoints = sorted((trained / "checkpoints").glob("step-*.pt"))
    assert 1 <= len(checkpoints) <= 3  # checkpoint.keep_last
    assert not list((trained / "checkpoints").glob(".*partial"))
    payload = torch.load(checkpoints[-1], map_location="cpu", weights_only=False)
    assert payload["progress"]["step"] == eval_records[-1]["step"]
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
            "tensorboard",  # the tracker's files, when one is chosen
            "tracker.json",
            "wandb",
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


@pytest.mark.shared_core
def test_a_training_set_smaller_than_one_global_batch_ends_launch_in_one_line(demo, tmp_path: Path) -> None:
    result = run_launch([*demo[1], "data.batch_size=100000", f"output_dir={tmp_path}"])
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "fewer than one global batch of 200000" in errors[0], errors
    assert "lower data.batch_size" in errors[0]
    assert not (tmp_path / "checkpoints").exists()


def run_on_a_terminal(args: list[str], timeout: float = 300) -> tuple[int, str]:
    """``launch.sh`` with a pseudo-terminal as stdout and stderr, as when a user runs it by hand."""
    reader, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 160 columns
    command = [str(PROJECT / "launch.sh"), *ON_THIS_MACHINE, *args]
    launch = subprocess.Popen(command, env=launch_env(2), stdout=terminal, stderr=terminal)
    os.close(terminal)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([reader], [], [], 1.0)[0]:
            continue
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # EIO: every process holding the terminal has ended
            break
        if not chunk:
            break
        output += chunk
    os.close(reader)
    launch.kill()  # a no-op when it ended; ends a hang the deadline caught
    return launch.wait(), output.decode(errors="replace")


@pytest.mark.shared_core
def test_progress_bar_on_rank_0_with_loss_lr_and_throughput(demo, tmp_path: Path) -> None:
    steps = ["train.max_steps=6", "train.log_every_steps=2"]
    code, output = run_on_a_terminal([*demo[1], *steps, f"output_dir={tmp_path}"])
    assert code == 0, output[-3000:]
    assert "6/6" in output  # the bar reached the last step
    assert "loss=" in output and "lr=" in output and "samples_s=" in output
    assert "[rank 1]" not in output  # the other rank is quiet
    eval_lines = [line for line in output.splitlines() if " eval " in line]
    assert len(eval_lines) == 1 and "eval_loss=" in eval_lines[0]  # one clean line per evaluation
    ends = [line for line in output.splitlines() if "wall time: launcher " in line]  # observe/phases.py
    assert len(ends) == 1 and "longest-batch probe" in ends[0] and "last checkpoint" in ends[0], ends


@pytest.mark.shared_core
def test_log_level_switch(demo, tmp_path: Path) -> None:
    result = run_launch([*demo[1], "train.max_steps=2", "log_level=warning", f"output_dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert " train " not in result.stderr and " eval " not in result.stderr
    assert read_metrics(tmp_path)  # quieter console, same records


@pytest.mark.compile
def test_compiled_model_trains_like_the_eager_one(deterministic, tmp_path: Path) -> None:
    """torch.compile wraps the DDP model; accumulation's no_sync still reaches DDP inside it.

    Not bitwise: compiled kernels sum in another order. Before any update the loss is the same function
    of the same weights, so it agrees to float32 rounding (relative 1e-6). After 3 steps at train.lr (a
    step moves a weight by up to about lr) the weights agree to 1e-4, under a tenth of one step: rounding,
    which Adam's normalisation enlarges on weights whose gradient is near 0, stays below it, while a lost
    or doubled gradient sync moves weights by whole steps."""
    run = [*deterministic, "train.max_steps=3", "train.grad_accum_steps=2", "data.batch_size=8"]
    run += ["train.log_every_steps=1"]
    for name, compiled in (("eager", "false"), ("compiled", "true")):
        result = run_launch([*run, f"train.compile={compiled}", f"output_dir={tmp_path / name}"], timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        assert "parameters identical on all 2 rank(s)" in result.stderr
    first_loss = {
        name: next(r for r in read_metrics(tmp_path / name) if "loss" in r) for name in ("eager", "compiled")
    }
    assert first_loss["eager"]["step"] == first_loss["compiled"]["step"] == 1
    assert first_loss["compiled"]["loss"] == pytest.approx(first_loss["eager"]["loss"], rel=1e-6)
    lr = float(next(item for item in reversed(run) if item.startswith("train.lr=")).split("=")[1])
    assert lr >= 1e-3, "the bound below is a tenth of a step of at least 1e-3"
    eager, compiled = final_weights(tmp_path / "eager"), final_weights(tmp_path / "compiled")
    worst = max((eager[name] - compiled[name]).abs().max().item() for name in eager)
    assert worst <= 1e-4, f"compiled training drifted from eager by {worst:.2e}"
