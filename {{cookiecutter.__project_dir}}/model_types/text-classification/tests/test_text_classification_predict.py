"""python -m <package>.predict on a text classifier: labels and scores in order, top-k, bad input lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from predict_helpers import prediction_error, predictions, run_predict
from text_data import write_rows

from {{ cookiecutter.package_name }}.task import classification
from {{ cookiecutter.package_name }}.task.hugging_face import (
    load_classifier,
    save_pretrained,
)

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
    alone = [
        predictions(classifier, Path(write_rows(tmp_path / "one.jsonl", [row])), output)[0] for row in rows
    ]
    assert all(record.keys() == {"label", "score"} and record["label"] in LABELS for record in alone)
    assert all(0 < record["score"] <= 1 for record in alone)
    assert len({round(record["score"], 5) for record in alone}) == len(TEXTS)  # so that the order shows
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", rows))
    for batch_size in ("1", "2", "32"):  # batches are grouped by length: they run in another order
        records = predictions(classifier, inputs, output, "--batch-size", batch_size)
        assert [record["label"] for record in records] == [record["label"] for record in alone]
        assert [record["score"] for record in records] == pytest.approx([r["score"] for r in alone], abs=1e-6)


def test_predict_top_k_lists_the_most_likely_labels(classifier: Path, tmp_path: Path) -> None:
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"text": text} for text in TEXTS]))
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
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", rows))
    assert prediction_error(classifier, inputs, capsys).startswith(f"error: {inputs}{message}")


def test_predict_refuses_a_model_without_a_trained_head(demo, tmp_path: Path, capsys) -> None:
    """The demo checkpoint is a masked LM: a classifier made of it would have a random head."""
    inputs = Path(write_rows(tmp_path / "inputs.jsonl", [{"text": "fine"}]))
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
