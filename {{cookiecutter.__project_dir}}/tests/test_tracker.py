"""The chosen tracker gets every metrics.jsonl record, from rank 0 only, and a resumed run continues the
same tracker run. Offline: TensorBoard event files, wandb's offline run files and a local MLflow database
are read back."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import read_metrics, run_launch

from {{ cookiecutter.package_name }}.config import (
    TrackerName,
    load_config,
)
from {{ cookiecutter.package_name }}.observe.trackers import RUN_FILE

pytestmark = pytest.mark.slow
TRACKER = load_config([]).tracker.name
Series = dict[str, list[tuple[int, float]]]


def offline(tmp_path: Path) -> dict[str, str]:
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }


def expected_series(output_dir: Path) -> Series:
    """The README's naming, written out here rather than taken from the code under test: a training
    record's numbers as ``train/<key>``, an evaluation record's as ``eval/<key without eval_>``; the
    step is the x axis and the wall-clock time stays out."""
    series: Series = {}
    for record in read_metrics(output_dir):
        evaluation = "eval_loss" in record
        for key, value in record.items():
            if key in ("step", "time"):
                continue
            tag = (
                f"eval/{key[len('eval_') :] if key.startswith('eval_') else key}"
                if evaluation
                else f"train/{key}"
            )
            series.setdefault(tag, []).append((record["step"], float(value)))
    return series


def read_tensorboard(output_dir: Path, tmp_path: Path) -> tuple[Series, list[str]]:
    """The series and the event files: TensorBoard's run is the folder, each writer adds one file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = output_dir / "tensorboard"
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
    series = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return series, sorted(path.name for path in log_dir.glob("events.out.tfevents.*"))


def wandb_records(run_file: Path):
    """The records of wandb's offline run file: a LevelDB-style log of 32 KiB blocks of protobufs."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, block = run_file.read_bytes(), 7, b"", 32768  # 7: the file header
    while position + 7 <= len(data):
        if block - position % block < 7:  # too little room for a header: the block's padding
            position += block - position % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_wandb(output_dir: Path, tmp_path: Path) -> tuple[Series, list[str]]:
    series: Series = {}
    run_ids = []
    for run_file in sorted(output_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(run_file):
            if record.WhichOneof("record_type") == "run":
                run_ids.append(record.run.run_id)
            if record.WhichOneof("record_type") == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                step = items.pop("_step")
                for tag, value in items.items():
                    if not tag.startswith("_"):
                        series.setdefault(tag, []).append((step, value))
    return series, run_ids


def read_mlflow(output_dir: Path, tmp_path: Path) -> tuple[Series, list[str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(offline(tmp_path)["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(load_config([]).tracker.project)
    runs = client.search_runs([experiment.experiment_id])
    series: Series = {}
    for run in runs:
        for tag in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, tag)
            series[tag] = sorted((metric.step, metric.value) for metric in history)
    return series, [run.info.run_id for run in runs]


READERS = {
    TrackerName.tensorboard: read_tensorboard,
    TrackerName.wandb: read_wandb,
    TrackerName.mlflow: read_mlflow,
}


def assert_same_series(expected: Series, actual: Series) -> None:
    assert sorted(expected) == sorted(actual)
    for tag, points in expected.items():
        got = actual[tag]
        assert [step for step, _ in got] == [step for step, _ in points], tag
        # TensorBoard keeps float32
        assert [value for _, value in got] == pytest.approx([value for _, value in points], rel=1e-6), tag


def test_rank_0_feeds_the_tracker_and_a_resumed_run_continues_it(demo, tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    first = run_launch([*demo[1], f"output_dir={output_dir}", "train.epochs=1"], **offline(tmp_path))
    assert first.returncode == 0, first.stderr[-4000:]
    series, runs = READERS[TRACKER](output_dir, tmp_path)
    assert len(runs) == 1, f"one tracker run expected (rank 0's), found {runs}"
    expected = expected_series(output_dir)
    assert {"train/loss", "train/lr", "train/samples_per_s", "train/epoch", "eval/loss", "eval/epoch"} <= set(
        expected
    )
    assert_same_series(expected, series)

    run_file = output_dir / RUN_FILE
    first_run = json.loads(run_file.read_text()) if run_file.exists() else None
    # The same command with one more epoch resumes from the first run's last checkpoint.
    second = run_launch([*demo[1], f"output_dir={output_dir}", "train.epochs=2"], **offline(tmp_path))
    assert second.returncode == 0, second.stderr[-4000:]
    series, runs = READERS[TRACKER](output_dir, tmp_path)
    if TRACKER is TrackerName.tensorboard:
        assert len(runs) == 2, f"one event file per launch, in the same folder: {runs}"
    else:
        assert len(set(runs)) == 1, f"the resumed run opened a new tracker run: {runs}"
        assert json.loads(run_file.read_text()) == first_run
    assert read_metrics(output_dir)[-1]["epoch"] == 2.0
    assert_same_series(expected_series(output_dir), series)


@pytest.mark.skipif(TRACKER is not TrackerName.wandb, reason="wandb's login")
def test_wandb_without_a_login_ends_the_job_in_one_line(demo, tmp_path: Path) -> None:
    not_logged_in = {"HOME": str(tmp_path), "WANDB_MODE": "online", "WANDB_API_KEY": ""}
    result = run_launch([*demo[1], f"output_dir={tmp_path / 'run'}"], **not_logged_in)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line or line.startswith("[rank")]
    assert len(errors) == 1 and errors[0].startswith("error: tracker.name=wandb: "), result.stderr[-3000:]
    assert "WANDB_MODE=offline" in errors[0]
