"""Text classification's data sources: CSV, Parquet, JSON and hub dataset folders, the preprocessing cache,
and ranks that wait for rank 0's preprocessing."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import METRIC, PACKAGE, PROJECT, read_metrics, run_launch
from text_data import ENV, config_of, config_overrides, demo_rows, samples_of, task_data

from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.data import cache as data_cache
from {{ cookiecutter.package_name }}.data.loader import DataError
from {{ cookiecutter.package_name }}.model_type import task


def test_a_relative_output_dir_caches_as_an_absolute_one(demo, tmp_path: Path, monkeypatch) -> None:
    """The demo's output_dir is relative (outputs/demo); datasets names its cache files absolutely."""
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    monkeypatch.chdir(tmp_path)
    relative = task.build_data(load_config([*config_overrides(demo, Path("relative")), *files]), ENV)
    absolute = task.build_data(config_of(demo, tmp_path / "absolute", *files), ENV)
    assert samples_of(relative.train) == samples_of(absolute.train)


def test_a_rerun_reads_the_tokenized_data_back_without_tokenizing(demo, tmp_path: Path, monkeypatch) -> None:
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    first = task.build_data(config_of(demo, tmp_path, *files), ENV)
    (folder,) = (tmp_path / "out" / "cache").glob("text-classification-*")
    assert {path.suffix for path in folder.iterdir()} == {".arrow", ".json"}  # data only: nothing unpickled

    def no_tokenizing(self, batch):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(task.Tokenize, "__call__", no_tokenizing)
    again = task.build_data(config_of(demo, tmp_path, *files), ENV)
    assert samples_of(again.train) == samples_of(first.train) and samples_of(again.val) == samples_of(
        first.val
    )
    assert again.label_names == first.label_names and torch.equal(again.train_lengths, first.train_lengths)
    with pytest.raises(AssertionError, match="tokenized again"):  # other settings: other tokens
        task.build_data(config_of(demo, tmp_path, *files, "data.max_length=8"), ENV)


def test_tokenizing_in_several_processes_gives_what_one_gives(demo, tmp_path: Path) -> None:
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    one = task.build_data(config_of(demo, tmp_path / "one", *files, "data.preprocessing_processes=1"), ENV)
    two = task.build_data(config_of(demo, tmp_path / "two", *files, "data.preprocessing_processes=2"), ENV)
    (folder,) = (tmp_path / "two" / "out" / "cache").glob("text-classification-*")
    assert len(list(folder.glob("train_*_of_00002.arrow"))) == 2
    assert samples_of(two.train) == samples_of(one.train) and samples_of(two.val) == samples_of(one.val)
    lengths = [len(ids) for ids, _ in one.train]
    assert one.train_lengths.tolist() == lengths and lengths == two.train_lengths.tolist()


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_csv_parquet_and_json_files_read_like_json_lines(demo, tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    rows = demo_rows(demo)
    reference = task_data(demo, tmp_path / "jsonl", rows, rows[:10])
    frame, val = pd.DataFrame(rows), pd.DataFrame(rows[:10])
    paths = [tmp_path / f"train{suffix}", tmp_path / f"val{suffix}"]
    for table, path in zip([frame, val], paths, strict=True):
        if suffix == ".json":  # one JSON array, not lines
            table.to_json(path, orient="records")
        else:
            {".csv": table.to_csv, ".parquet": table.to_parquet}[suffix](path, index=False)
    data = task.build_data(
        config_of(demo, tmp_path / "other", f"data.train_file={paths[0]}", f"data.val_file={paths[1]}"), ENV
    )
    assert data.label_names == reference.label_names
    assert samples_of(data.train) == samples_of(reference.train) and samples_of(data.val) == samples_of(
        reference.val
    )


def test_a_hub_dataset_folder_with_other_column_names(demo, tmp_path: Path) -> None:
    import datasets

    rows = demo_rows(demo)
    reference = task_data(demo, tmp_path / "jsonl", rows, rows[:10])
    renamed = {
        name: datasets.Dataset.from_list([{"sentence": r["text"], "sentiment": r["label"]} for r in part])
        for name, part in (("train", rows), ("test", rows[:10]))
    }
    datasets.DatasetDict(renamed).save_to_disk(tmp_path / "saved")
    (tmp_path / "files").mkdir()
    for name, split in renamed.items():  # a folder of data files: splits named by file, as on the hub
        split.to_csv(tmp_path / "files" / f"{name}.csv", index=False)
    for folder in ("saved", "files"):
        overrides = [f"data.hub_dataset={tmp_path / folder}", "data.val_split=test"]
        fields = ["data.text_field=sentence", "data.label_field=sentiment"]
        data = task.build_data(config_of(demo, tmp_path / folder / "run", *overrides, *fields), ENV)
        assert data.label_names == reference.label_names, folder
        assert samples_of(data.train) == samples_of(reference.train), folder
        assert samples_of(data.val) == samples_of(reference.val), folder


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.text_field=body"], "[train]: row 1: missing field 'body'"),
        (["data.val_split=validation"], "has no split 'validation' (it has: train)"),
        (["data.hub_dataset=no/such-dataset"], "data.hub_dataset='no/such-dataset': cannot load it"),
    ],
)
def test_a_hub_dataset_that_does_not_fit_is_named(
    demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides, message: str
) -> None:
    import datasets
    import huggingface_hub

    # Offline, as HF_HUB_OFFLINE=1 sets it: an unknown hub id then fails at once, where a machine without
    # a route to the hub would wait out connection retries (23 s here).
    for constants in (datasets.config, huggingface_hub.constants):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    datasets.Dataset.from_list(demo_rows(demo)).save_to_disk(tmp_path / "saved")
    config = config_of(
        demo, tmp_path, f"data.hub_dataset={tmp_path / 'saved'}", "data.val_split=", *overrides
    )
    with pytest.raises(DataError) as error:
        task.build_data(config, ENV)
    assert message in str(error.value)


def test_bad_csv_rows_are_named_by_row(demo, tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood,a\n,b\n")
    with pytest.raises(DataError, match=r"train\.csv: row 2: missing field 'text'"):
        task.build_data(config_of(demo, tmp_path, f"data.train_file={train}", "data.val_file="), ENV)
    train.write_text("text,label\ngood,1\nbad,x,y\n")
    with pytest.raises(DataError, match=r"train\.csv: not readable as CSV \(Error tokenizing data.*line 3"):
        task.build_data(config_of(demo, tmp_path, f"data.train_file={train}", "data.val_file="), ENV)


def test_the_pre_checks_leave_a_hub_dataset_to_the_run(demo, tmp_path: Path) -> None:
    from {{ cookiecutter.package_name }} import doctor
    from {{ cookiecutter.package_name }}.launch import preflight

    missing = tmp_path / "nowhere.jsonl"  # not read with data.hub_dataset
    config = config_of(demo, tmp_path, "data.hub_dataset=some/dataset", f"data.train_file={missing}")
    preflight.check(config)
    assert [status for status, _ in doctor.data_files(config)] == [doctor.OK]
    config.data.hub_dataset = ""
    with pytest.raises(ConfigError, match=r"data\.train_file=.* does not exist"):
        preflight.check(config)


def test_a_node_that_does_not_see_rank_0s_files_builds_its_own_cache() -> None:
    seen = [("n0", True), ("n0", True), ("n1", False), ("n1", False), ("n2", True), ("n2", True)]
    assert data_cache.builders_by_rank(seen) == [0, 0, 2, 2, 0, 0]


class MinuteWaits:
    """The builder's outcome as a waiting rank sees it: published after ``minutes`` whole waits."""

    def __init__(self, minutes: int) -> None:
        self.left, self.waits = minutes, []

    def __call__(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.left -= 1
        return self.left < 0


def test_a_waiting_rank_logs_a_line_every_minute(caplog) -> None:
    ready = MinuteWaits(2)
    with caplog.at_level("WARNING"):
        data_cache.wait_for(ready, builder=0, reporting=True)
    assert [record.getMessage() for record in caplog.records] == [
        "waiting for rank 0 to preprocess the data: 1 min so far",
        "waiting for rank 0 to preprocess the data: 2 min so far",
    ]
    assert ready.waits == [60.0] * 3  # each wait blocks on the store for up to a minute: no polling
    caplog.clear()
    data_cache.wait_for(MinuteWaits(2), builder=0, reporting=False)  # the other waiting ranks
    assert not caplog.records


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=60), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timedelta(seconds=60))
    yield dist.PrefixStore("round-1", server), dist.PrefixStore("round-1", client)


def test_a_waiting_rank_wakes_when_the_builder_publishes_not_at_its_next_look(store) -> None:
    """The store wakes the waiting rank as the key is set: a rank that looked every half second started up
    to 0.5 s after a quick build, and the first step waits for the last rank."""
    builder, waiting = store
    ready = data_cache.published(waiting, "data-cache/0/0")
    assert not ready(0.05)  # nothing published yet: the wait times out and says so
    publish = threading.Timer(0.2, builder.set, args=("data-cache/0/0", "{}"))
    started = time.monotonic()
    publish.start()
    assert ready(30.0)
    assert time.monotonic() - started < 15.0  # woken by the key, long before the wait's 30 s
    publish.join()


# Loaded into every training process (sitecustomize runs at start-up): the rank that preprocesses takes
# SECONDS longer, for real, before it publishes the cache; the others wait as they would for a big data set.
SLOW_PREPROCESSING = """
import os, sys, time
if "LOCAL_RANK" in os.environ:
    from %(package)s.data import cache as data_cache

    build = data_cache.build_or_open

    def slow_build(recipe, root):
        time.sleep(%(seconds)d)
        print("rank", os.environ["RANK"], "preprocessed %(seconds)d s longer", file=sys.stderr, flush=True)
        return build(recipe, root)

    data_cache.build_or_open = slow_build
"""


@pytest.mark.slow
def test_preprocessing_longer_than_the_collective_timeout_trains(demo, tmp_path: Path) -> None:
    """The other ranks wait on the store, in no collective, so distributed.timeout_s does not apply."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_PREPROCESSING % {"package": PACKAGE, "seconds": 45})
    output_dir = tmp_path / "out"
    overrides = [*demo[1], f"output_dir={output_dir}", "distributed.timeout_s=30", "train.max_steps=2"]
    result = run_launch(overrides, PYTHONPATH=f"{hook}{os.pathsep}{PROJECT / 'src'}")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 0 preprocessed 45 s longer" in result.stderr  # the one rank that builds: the slow one
    assert "rank 1 preprocessed" not in result.stderr
    assert [r["step"] for r in read_metrics(output_dir) if "loss" in r] == [1, 2]


@pytest.mark.slow
def test_csv_and_parquet_train_and_a_rerun_does_not_tokenize_again(demo, tmp_path: Path) -> None:
    import pandas as pd

    for split, suffix in (("train", "csv"), ("val", "parquet")):
        frame = pd.read_json(demo[0] / f"{split}.jsonl", lines=True)
        getattr(frame, f"to_{suffix}")(tmp_path / f"{split}.{suffix}", index=False)
    output_dir = tmp_path / "out"
    files = [f"data.train_file={tmp_path / 'train.csv'}", f"data.val_file={tmp_path / 'val.parquet'}"]
    run = [*demo[1], *files, f"output_dir={output_dir}", "train.max_steps=2"]
    first = run_launch(run)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "tokenized" in first.stderr
    again = run_launch([*run, "checkpoint.start_over=true"])  # a new process reads the cache back
    assert again.returncode == 0, again.stderr[-4000:]
    assert "tokenized" not in again.stderr and "from an earlier run" in again.stderr
    assert [r["step"] for r in read_metrics(output_dir) if "loss" in r] == [1, 2]
    assert METRIC in read_metrics(output_dir)[-1]


@pytest.mark.slow
def test_a_local_hub_dataset_folder_trains(demo, tmp_path: Path) -> None:
    """A folder of data files is read by load_dataset, the code path of a hub id (tests have no network)."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    for split, name in (("train", "train"), ("val", "validation")):  # splits named by file, as on the hub
        (folder / f"{name}.jsonl").write_bytes((demo[0] / f"{split}.jsonl").read_bytes())
    output_dir = tmp_path / "out"
    missing = tmp_path / "nowhere.jsonl"  # not read: data.hub_dataset replaces the files
    run = [*demo[1], f"data.hub_dataset={folder}", f"data.train_file={missing}", f"output_dir={output_dir}"]
    result = run_launch([*run, "train.max_steps=2"])
    assert result.returncode == 0, result.stderr[-4000:]
    assert METRIC in read_metrics(output_dir)[-1]
