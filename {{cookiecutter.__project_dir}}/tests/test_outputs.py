"""What a run does with output_dir: nothing lost, nothing executed, every rerun says what it does.

Runs the loop in this process (no torchrun), so each case takes seconds.
"""

from __future__ import annotations

import errno
import json
import logging
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from conftest import read_metrics
from inprocess import StopAfter, fit

from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.launch.preemption import (
    Preempted,
)
from {{ cookiecutter.package_name }}.loop.nonfinite import (
    TrainingDiverged,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    TASK,
)

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.parallel import (
    checkpoint as checkpoint_module,
)
from {{ cookiecutter.package_name }}.parallel.checkpoint import (
    Checkpointer,
    CheckpointError,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)
from {{ cookiecutter.package_name }}.task.spec import (
    dataset_size,
)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The run's output_dir, apart from the model copy that ``deterministic`` puts in tmp_path."""
    return tmp_path / "run"


RUN = ["train.max_steps=4", "checkpoint.every_steps=2", "train.log_every_steps=1", "data.num_workers=0"]
ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()
    }


class Planted:
    """A pickle that would create ``marker`` when unpickled by a loader that runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_every_checkpoint_unreadable_stops_before_training(deterministic, out: Path) -> None:
    run = [*deterministic, *RUN, f"output_dir={out}"]
    fit(run)
    for path in (out / "checkpoints").glob("step-*.pt"):
        path.write_bytes(path.read_bytes()[:500])  # every checkpoint torn
    before = snapshot(out)
    with pytest.raises(CheckpointError) as refused:
        fit(run)
    message = str(refused.value)
    assert "none can be read" in message and "step-00000004.pt" in message and "\n" not in message
    assert "new output_dir" in message and "checkpoint.start_over=true" in message
    assert snapshot(out) == before  # nothing trained over, nothing deleted

    fit([*run, "checkpoint.start_over=true"])
    moved = {name: content for name, content in before.items() if not name.startswith("cache/")}
    assert snapshot(out / "previous-1") == moved
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3, 4]


def test_retention_keeps_newer_checkpoints_and_the_one_just_written(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path, ENV, keep_last=2)

    def left() -> list[int]:
        return sorted(int(path.stem.removeprefix("step-")) for path in tmp_path.iterdir())

    for step in (1, 2, 3, 9):  # 9: newer than the run writes now, e.g. skipped as unreadable at resume
        (tmp_path / f"step-{step:08d}.pt").touch()
    (tmp_path / "step-00000004.pt").touch()
    checkpointer.retain(tmp_path / "step-00000004.pt")
    assert left() == [3, 4, 9]  # the two newest up to the one just written, and the newer one
    (tmp_path / "step-00000001.pt").touch()  # a run started over writes step 1 again
    checkpointer.retain(tmp_path / "step-00000001.pt")
    assert left() == [1, 3, 4, 9]


def test_checkpoints_are_read_memory_mapped_without_running_code(
    deterministic, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = [*deterministic, *RUN, f"output_dir={out}"]
    fit(run)
    marker = out / "code-ran"
    planted = out / "checkpoints" / "step-00000099.pt"
    planted.write_bytes(pickle.dumps({"format": 3, "payload": Planted(marker)}))
    (out / "final").rename(out / "final-before")  # so the rerun resumes instead of stopping
    calls: list[tuple[Path, dict]] = []
    load = torch.load

    def spy(path: Path, *args: object, **kwargs: object) -> object:
        calls.append((Path(path), kwargs))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "load", spy)
    fit(run)
    assert not marker.exists()
    reads = [kwargs for path, kwargs in calls if path.parent == out / "checkpoints"]
    assert reads and all(kwargs.get("weights_only") and kwargs.get("mmap") for kwargs in reads)


def test_a_planted_preprocessing_cache_is_rebuilt_not_run(deterministic, out: Path) -> None:
    run = [*deterministic, *RUN, "train.max_steps=1", f"output_dir={out}"]
    fit(run)
    caches = [path for path in (out / "cache").rglob("*") if path.is_file()]
    marker = out / "code-ran"
    for cache in caches:  # every file: the manifest, the Arrow data, whatever a library might read
        cache.write_bytes(pickle.dumps(Planted(marker)))
    fit([*run, "checkpoint.start_over=true"])
    assert not marker.exists()
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1]  # trained on the rebuilt cache
    for cache in caches:
        assert not cache.exists() or cache.read_bytes() != pickle.dumps(Planted(marker))


def test_a_finished_run_rerun_changes_nothing(deterministic, out: Path, caplog) -> None:
    run = [*deterministic, *RUN, f"output_dir={out}"]
    first = fit(run)
    before = snapshot(out)
    with caplog.at_level(logging.INFO):
        again = fit(run)
    assert again == {key: value for key, value in first.items()}
    assert snapshot(out) == before
    assert "holds a finished run" in caplog.text

    # Killed after its last checkpoint, before final/: the rerun saves final/ and repeats no record.
    records = read_metrics(out)
    shutil.rmtree(out / "final")  # with LoRA, final/adapter/ too
    fit(run)
    assert (out / "final" / "model.safetensors").is_file()
    assert [{k: v for k, v in r.items() if k != "time"} for r in read_metrics(out)] == [
        {k: v for k, v in r.items() if k != "time"} for r in records
    ]


def test_changed_settings_on_resume_are_listed_and_the_old_config_kept(
    deterministic, out: Path, caplog
) -> None:
    run = [*deterministic, *RUN, f"output_dir={out}"]
    with pytest.raises(Preempted):
        fit(run, StopAfter(2))
    old_config = (out / "config.yaml").read_text()
    with caplog.at_level(logging.WARNING):
        fit([*run, "train.lr=1e-4"])
    warnings = [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]
    assert len(warnings) == 1 and "train.lr" in warnings[0] and "-> 0.0001" in warnings[0]
    assert (out / "config.up-to-step-2.yaml").read_text() == old_config
    assert "lr: 0.0001" in (out / "config.yaml").read_text()


def test_resuming_with_a_global_batch_larger_than_the_epoch_has_left_finishes(
    deterministic, out: Path
) -> None:
    """The epoch's remaining samples hold no whole new global batch: it ends, and the next one starts."""
    base = [
        *deterministic,
        "data.num_workers=0",
        "train.epochs=2",
        "data.val_file=",
        f"output_dir={out}",
    ]
    samples = dataset_size(TASK.build_data(load_config(base), ENV).train)
    with pytest.raises(Preempted):
        fit([*base, "data.batch_size=8"], StopAfter(samples // 8 - 1))
    fit([*base, f"data.batch_size={samples // 2 + 1}"])  # one batch per epoch, larger than what is left
    assert (out / "final").is_dir()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_non_finite_numbers_are_refused_in_the_config(value: str) -> None:
    with pytest.raises(ConfigError, match=r"train\.lr: (.* is not a finite number|must be > 0)"):
        load_config([f"train.lr={value}"])


def test_a_diverging_run_stops_at_the_first_non_finite_step(deterministic, out: Path) -> None:
    run = [*deterministic, "train.max_steps=6", "train.log_every_steps=3", "checkpoint.every_steps=3"]
    with pytest.raises(TrainingDiverged) as diverged:
        fit([*run, "train.lr=1e12", "train.warmup_ratio=0", "data.num_workers=0", f"output_dir={out}"])
    message = str(diverged.value)
    assert message.startswith("step ") and "train.lr=1e+12" in message and "\n" not in message
    for line in (out / "metrics.jsonl").read_text().splitlines():  # strict JSON: no NaN, no Infinity
        json.loads(line, parse_constant=lambda token: pytest.fail(f"{token} in metrics.jsonl"))
    bad_step = int(message.split()[1].rstrip(":"))
    saved = [int(path.stem.split("-")[1]) for path in (out / "checkpoints").glob("step-*.pt")]
    assert all(step < bad_step for step in saved)
    assert not (out / "final").exists()


def test_a_full_disk_while_checkpointing_is_one_line_and_leaves_no_partial_file(
    deterministic, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save = torch.save

    def no_space_for_checkpoints(payload: object, target: object, *args: object, **kwargs: object) -> None:
        if "checkpoints" in str(getattr(target, "name", target)):
            raise OSError(errno.ENOSPC, "No space left on device")
        save(payload, target, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", no_space_for_checkpoints)
    with pytest.raises(CheckpointError, match="no space left to write the checkpoint of step 2") as full:
        fit([*deterministic, *RUN, f"output_dir={out}"])
    assert "\n" not in str(full.value)
    assert not list((out / "checkpoints").glob(".*partial"))
