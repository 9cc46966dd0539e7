"""Text classification: the JSON Lines format, label mapping, bad-data errors, dynamic padding, final/,
and predict on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, PACKAGE, PROJECT, read_metrics, run_launch
from predict_helpers import prediction_error, predictions, run_predict

from {{ cookiecutter.package_name }} import classification, data_cache
from {{ cookiecutter.package_name }}.config import ConfigError, load_config
from {{ cookiecutter.package_name }}.data import DataError
from {{ cookiecutter.package_name }}.distributed import DistEnv
from {{ cookiecutter.package_name }}.hf import (
    load_classifier,
    save_pretrained,
)
from {{ cookiecutter.package_name }}.model_type import task

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _write(path: Path, rows: list[object]) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def _data(demo: tuple[Path, list[str]], tmp_path: Path, train: list[object], val: list[object] | None = None):
    directory, _ = demo
    tmp_path.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"model.pretrained={directory / 'model'}",
        f"data.train_file={_write(tmp_path / 'train.jsonl', train)}",
        f"data.val_file={_write(tmp_path / 'val.jsonl', val) if val is not None else ''}",
        f"output_dir={tmp_path / 'out'}",
        *ON_THIS_MACHINE,
    ]
    return task.build_data(load_config(overrides), ENV)


def test_string_labels_get_sorted_ids(demo, tmp_path: Path) -> None:
    rows = [
        {"text": "good", "label": "pos"},
        {"text": "bad", "label": "neg"},
        {"text": "meh", "label": "mid"},
    ]
    data = _data(demo, tmp_path, rows, rows[:2])
    assert data.label_names == ["mid", "neg", "pos"]
    assert [label for _, label in data.train] == [2, 1, 0]
    assert [label for _, label in data.val] == [2, 1]


def test_integer_labels_keep_their_values(demo, tmp_path: Path) -> None:
    data = _data(demo, tmp_path, [{"text": "a", "label": 2}, {"text": "b", "label": 0}])
    assert data.label_names == ["0", "1", "2"]
    assert [label for _, label in data.train] == [2, 0]
    assert data.val is None


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [
        (['{"text": "a", "label": 1}', "{not json"], None, "train.jsonl:2: not valid JSON"),
        ([{"text": "a", "label": 1}, {"text": "b"}], None, "train.jsonl:2: missing field 'label'"),
        ([{"label": 1}], None, "train.jsonl:1: missing field 'text'"),
        (
            [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}, {"text": "c", "label": 1}],
            None,
            "train.jsonl: line 3 has an integer label, line 1 a string label; use one kind",
        ),
        (
            [{"text": "a", "label": 1}, {"text": "b", "label": "x"}],
            None,
            "train.jsonl: line 2 has a string label, line 1 an integer label; use one kind",
        ),
        ([{"text": "a", "label": 1}, {"text": "b", "label": 1.5}], None, "train.jsonl:2: label 1.5 must be"),
        ([{"text": "a", "label": -1}], None, "train.jsonl:1: label -1 is negative"),
        ([{"text": "a", "label": True}], None, "train.jsonl:1: label True must be"),
        ([{"text": 5, "label": 0}], None, "train.jsonl:1: field 'text' must be a string"),
        ([], None, "train.jsonl: no records"),
        (
            [{"text": "a", "label": "x"}],
            [{"text": "b", "label": "y"}],
            "val.jsonl:1: label 'y' never appears",
        ),
        ([{"text": "a", "label": 0}], [{"text": "b", "label": "0"}], "val.jsonl:1: label '0' never appears"),
        (
            [{"text": "a", "label": 0}, {"text": "b", "label": 1}, {"text": "c", "label": 1000000}],
            None,
            "train.jsonl:3: label 1000000 makes a head of 1000001 classes, 999998 of them never used",
        ),
    ],
)
def test_bad_data_names_file_and_line(demo, tmp_path: Path, train, val, message: str) -> None:
    with pytest.raises(DataError) as error:
        _data(demo, tmp_path, train, val)
    assert message in str(error.value)


def test_integer_labels_may_skip_a_few_ids(demo, tmp_path: Path) -> None:
    rows = [{"text": "a", "label": 0}, {"text": "b", "label": 1}, {"text": "c", "label": 50}]
    assert len(_data(demo, tmp_path, rows).label_names) == 51


def test_a_line_that_is_not_utf8_is_named(demo, tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    train.write_bytes(b'{"text": "fine", "label": 0}\n{"text": "caf\xe9", "label": 1}\n')
    config = load_config(
        [f"model.pretrained={demo[0] / 'model'}", f"data.train_file={train}", "data.val_file=",
         f"output_dir={tmp_path / 'out'}", *ON_THIS_MACHINE]
    )  # fmt: skip
    with pytest.raises(DataError, match=r"train\.jsonl:2: not UTF-8 \(byte 0xe9 at column 14\)"):
        task.build_data(config, ENV)


def test_batches_are_padded_to_their_own_longest_sample() -> None:
    batch = task.Collator(pad_token_id=0)([([5, 6, 7], 1), ([8], 0)])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 0]


def _config_overrides(demo, directory: Path, *overrides: str) -> list[str]:
    return [
        f"model.pretrained={demo[0] / 'model'}",
        f"output_dir={directory / 'out'}",
        *ON_THIS_MACHINE,
        *overrides,
    ]


def _config(demo, tmp_path: Path, *overrides: str):
    return load_config(_config_overrides(demo, tmp_path, *overrides))


def test_a_relative_output_dir_caches_as_an_absolute_one(demo, tmp_path: Path, monkeypatch) -> None:
    """The demo's output_dir is relative (outputs/demo); datasets names its cache files absolutely."""
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    monkeypatch.chdir(tmp_path)
    relative = task.build_data(load_config([*_config_overrides(demo, Path("relative")), *files]), ENV)
    absolute = task.build_data(_config(demo, tmp_path / "absolute", *files), ENV)
    assert _samples(relative.train) == _samples(absolute.train)


def _samples(dataset) -> list[tuple[list[int], int]]:
    return [(ids.tolist(), label) for ids, label in dataset]


def test_a_rerun_reads_the_tokenized_data_back_without_tokenizing(demo, tmp_path: Path, monkeypatch) -> None:
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    first = task.build_data(_config(demo, tmp_path, *files), ENV)
    (folder,) = (tmp_path / "out" / "cache").glob("text-classification-*")
    assert {path.suffix for path in folder.iterdir()} == {".arrow", ".json"}  # data only: nothing unpickled

    def no_tokenizing(self, batch):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(task.Tokenize, "__call__", no_tokenizing)
    again = task.build_data(_config(demo, tmp_path, *files), ENV)
    assert _samples(again.train) == _samples(first.train) and _samples(again.val) == _samples(first.val)
    assert again.label_names == first.label_names and torch.equal(again.train_lengths, first.train_lengths)
    with pytest.raises(AssertionError, match="tokenized again"):  # other settings: other tokens
        task.build_data(_config(demo, tmp_path, *files, "data.max_length=8"), ENV)


def test_tokenizing_in_several_processes_gives_what_one_gives(demo, tmp_path: Path) -> None:
    directory, _ = demo
    files = [f"data.train_file={directory / 'train.jsonl'}", f"data.val_file={directory / 'val.jsonl'}"]
    one = task.build_data(_config(demo, tmp_path / "one", *files, "data.preprocessing_processes=1"), ENV)
    two = task.build_data(_config(demo, tmp_path / "two", *files, "data.preprocessing_processes=2"), ENV)
    (folder,) = (tmp_path / "two" / "out" / "cache").glob("text-classification-*")
    assert len(list(folder.glob("train_*_of_00002.arrow"))) == 2
    assert _samples(two.train) == _samples(one.train) and _samples(two.val) == _samples(one.val)
    lengths = [len(ids) for ids, _ in one.train]
    assert one.train_lengths.tolist() == lengths and lengths == two.train_lengths.tolist()


def _demo_rows(demo) -> list[dict]:
    lines = (demo[0] / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:40]]


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_csv_parquet_and_json_files_read_like_json_lines(demo, tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    rows = _demo_rows(demo)
    reference = _data(demo, tmp_path / "jsonl", rows, rows[:10])
    frame, val = pd.DataFrame(rows), pd.DataFrame(rows[:10])
    paths = [tmp_path / f"train{suffix}", tmp_path / f"val{suffix}"]
    for table, path in zip([frame, val], paths, strict=True):
        if suffix == ".json":  # one JSON array, not lines
            table.to_json(path, orient="records")
        else:
            {".csv": table.to_csv, ".parquet": table.to_parquet}[suffix](path, index=False)
    data = task.build_data(
        _config(demo, tmp_path / "other", f"data.train_file={paths[0]}", f"data.val_file={paths[1]}"), ENV
    )
    assert data.label_names == reference.label_names
    assert _samples(data.train) == _samples(reference.train) and _samples(data.val) == _samples(reference.val)


def test_a_hub_dataset_folder_with_other_column_names(demo, tmp_path: Path) -> None:
    import datasets

    rows = _demo_rows(demo)
    reference = _data(demo, tmp_path / "jsonl", rows, rows[:10])
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
        data = task.build_data(_config(demo, tmp_path / folder / "run", *overrides, *fields), ENV)
        assert data.label_names == reference.label_names, folder
        assert _samples(data.train) == _samples(reference.train), folder
        assert _samples(data.val) == _samples(reference.val), folder


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.text_field=body"], "[train]: row 1: missing field 'body'"),
        (["data.val_split=validation"], "has no split 'validation' (it has: train)"),
        (["data.hub_dataset=no/such-dataset"], "data.hub_dataset='no/such-dataset': cannot load it"),
    ],
)
def test_a_hub_dataset_that_does_not_fit_is_named(demo, tmp_path: Path, overrides, message: str) -> None:
    import datasets

    datasets.Dataset.from_list(_demo_rows(demo)).save_to_disk(tmp_path / "saved")
    config = _config(demo, tmp_path, f"data.hub_dataset={tmp_path / 'saved'}", "data.val_split=", *overrides)
    with pytest.raises(DataError) as error:
        task.build_data(config, ENV)
    assert message in str(error.value)


def test_bad_csv_rows_are_named_by_row(demo, tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood,a\n,b\n")
    with pytest.raises(DataError, match=r"train\.csv: row 2: missing field 'text'"):
        task.build_data(_config(demo, tmp_path, f"data.train_file={train}", "data.val_file="), ENV)
    train.write_text("text,label\ngood,1\nbad,x,y\n")
    with pytest.raises(DataError, match=r"train\.csv: not readable as CSV \(Error tokenizing data.*line 3"):
        task.build_data(_config(demo, tmp_path, f"data.train_file={train}", "data.val_file="), ENV)


def test_the_pre_checks_leave_a_hub_dataset_to_the_run(demo, tmp_path: Path) -> None:
    from {{ cookiecutter.package_name }} import doctor, preflight

    missing = tmp_path / "nowhere.jsonl"  # not read with data.hub_dataset
    config = _config(demo, tmp_path, "data.hub_dataset=some/dataset", f"data.train_file={missing}")
    preflight.check(config)
    assert [status for status, _ in doctor.data_files(config)] == [doctor.OK]
    config.data.hub_dataset = ""
    with pytest.raises(ConfigError, match=r"data\.train_file=.* does not exist"):
        preflight.check(config)


def test_a_node_that_does_not_see_rank_0s_files_builds_its_own_cache() -> None:
    seen = [("n0", True), ("n0", True), ("n1", False), ("n1", False), ("n2", True), ("n2", True)]
    assert data_cache.builders_by_rank(seen) == [0, 0, 2, 2, 0, 0]


class FakeClock:
    """Each poll of the store takes 25 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += 25


def test_a_waiting_rank_logs_a_line_every_minute(monkeypatch, caplog) -> None:
    monkeypatch.setattr(data_cache, "time", FakeClock())
    polls = iter([False] * 6 + [True])  # ready after 150 s
    with caplog.at_level("WARNING"):
        data_cache.wait_for(lambda: next(polls), builder=0, reporting=True)
    assert [record.getMessage() for record in caplog.records] == [
        "waiting for rank 0 to preprocess the data: 1 min so far",
        "waiting for rank 0 to preprocess the data: 2 min so far",
    ]
    polls = iter([False] * 6 + [True])
    caplog.clear()
    data_cache.wait_for(lambda: next(polls), builder=0, reporting=False)  # the other waiting ranks
    assert not caplog.records


@pytest.mark.slow
def test_final_model_loads_with_auto_classes_and_keeps_label_names(trained: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    final = trained / "final"
    model = AutoModelForSequenceClassification.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    with torch.no_grad():
        logits = model(**tokenizer(["The film was great!"], return_tensors="pt")).logits
    assert logits.shape == (1, 3)
    assert read_metrics(trained)[-1][METRIC] > 0.5  # the demo is learnable


@pytest.mark.slow
def test_a_corrupt_line_ends_launch_in_one_line_naming_it(demo, tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.jsonl", ['{"text": "fine", "label": "a"}'] * 30 + ['{"text": "cut sho'])
    result = run_launch([*demo[1], f"data.train_file={bad}", f"output_dir={tmp_path / 'out'}"])
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}:31: not valid JSON"), errors
    assert not (tmp_path / "out" / "checkpoints").exists()


# ---- python -m <package>.predict ------------------------------------------------------------------
LABELS = ["negative", "neutral", "positive"]
TEXTS = ["Great!", "The film was really wonderful and I loved it.", "", "Awful.", "It was fine, I suppose."]


@pytest.fixture(scope="module")
def classifier(demo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as training saves final/: the demo checkpoint with a seeded three-class head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_dir, final = demo[0] / "model", tmp_path_factory.mktemp("final")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = load_classifier(AutoModelForSequenceClassification, str(model_dir), LABELS)
    save_pretrained(model, AutoTokenizer.from_pretrained(model_dir), final)
    return final


def test_predict_writes_a_label_and_score_per_input_in_order(classifier: Path, tmp_path: Path) -> None:
    rows = [{"text": text, "label": "ignored"} for text in TEXTS]
    output = tmp_path / "predictions.jsonl"
    alone = [predictions(classifier, Path(_write(tmp_path / "one.jsonl", [row])), output)[0] for row in rows]
    assert all(record.keys() == {"label", "score"} and record["label"] in LABELS for record in alone)
    assert all(0 < record["score"] <= 1 for record in alone)
    assert len({round(record["score"], 5) for record in alone}) == len(TEXTS)  # so that the order shows
    inputs = Path(_write(tmp_path / "inputs.jsonl", rows))
    for batch_size in ("1", "2", "32"):  # batches are grouped by length: they run in another order
        records = predictions(classifier, inputs, output, "--batch-size", batch_size)
        assert [record["label"] for record in records] == [record["label"] for record in alone]
        assert [record["score"] for record in records] == pytest.approx([r["score"] for r in alone], abs=1e-6)


def test_predict_top_k_lists_the_most_likely_labels(classifier: Path, tmp_path: Path) -> None:
    inputs = Path(_write(tmp_path / "inputs.jsonl", [{"text": text} for text in TEXTS]))
    for record in predictions(classifier, inputs, tmp_path / "out.jsonl", "--top-k", "2"):
        scores = record["scores"]
        assert len(scores) == 2 and scores[0] == {"label": record["label"], "score": record["score"]}
        assert scores[0]["score"] >= scores[1]["score"]


@pytest.mark.parametrize(
    ("id2label", "names"),
    [
        ({0: "0", 1: "1", 2: "2"}, [0, 1, 2]),
        ({0: "neg", 1: "pos"}, ["neg", "pos"]),
        ({0: "1", 1: "0"}, ["1", "0"]),
    ],
)
def test_integer_labels_are_predicted_as_integers(id2label: dict[int, str], names: list[object]) -> None:
    assert classification.class_names(id2label) == names


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"text": "fine"}, {"text": 5}], ":2: field 'text' must be a string"),
        ([{"text": "fine"}, "{not json"], ":2: not valid JSON"),
        ([{"label": "x"}], ":1: missing field 'text'"),
    ],
)
def test_predict_names_a_bad_input_line_in_one_line(
    classifier: Path, tmp_path: Path, capsys, rows, message
) -> None:
    inputs = Path(_write(tmp_path / "inputs.jsonl", rows))
    assert prediction_error(classifier, inputs, capsys).startswith(f"error: {inputs}{message}")


def test_predict_refuses_a_model_without_a_trained_head(demo, tmp_path: Path, capsys) -> None:
    """The demo checkpoint is a masked LM: a classifier made of it would have a random head."""
    inputs = Path(_write(tmp_path / "inputs.jsonl", [{"text": "fine"}]))
    error = prediction_error(demo[0] / "model", inputs, capsys)
    assert error.startswith(f"error: {demo[0] / 'model'}: not a fine-tuned text classifier")


@pytest.mark.slow
def test_predict_with_the_trained_model_finds_the_validation_labels(
    demo, trained: Path, tmp_path: Path
) -> None:
    val, output = demo[0] / "val.jsonl", tmp_path / "predictions.jsonl"
    result = run_predict(str(trained / "final"), str(val), "--output", str(output))
    assert result.returncode == 0, result.stderr
    expected = [json.loads(line)["label"] for line in val.read_text(encoding="utf-8").splitlines()]
    predicted = [json.loads(line)["label"] for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(predicted) == len(expected)
    assert sum(p == e for p, e in zip(predicted, expected, strict=True)) / len(expected) > 0.5


# Loaded into every training process (sitecustomize runs at start-up): the rank that preprocesses takes
# SECONDS longer, for real, before it publishes the cache; the others wait as they would for a big data set.
SLOW_PREPROCESSING = """
import os, sys, time
if "LOCAL_RANK" in os.environ:
    from %(package)s import data_cache

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
