"""Text classification: the JSON Lines format, label mapping, bad-data errors, dynamic padding, final/,
and predict on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, read_metrics, run_launch
from predict_helpers import prediction_error, predictions, run_predict

from {{ cookiecutter.package_name }} import classification
from {{ cookiecutter.package_name }}.config import load_config
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


def test_tokenization_is_cached_for_the_other_ranks(demo, tmp_path: Path) -> None:
    _data(demo, tmp_path, [{"text": "a b", "label": "x"}])
    assert len(list((tmp_path / "out" / "cache").glob("text-classification-*.pt"))) == 1


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
