"""Text classification: the JSON Lines format, label mapping, bad-data errors, dynamic padding, final/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, read_metrics, run_launch
from text_data import ENV, task_data, write_rows

from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.data.loader import DataError
from {{ cookiecutter.package_name }}.model_type import task


def test_string_labels_get_sorted_ids(demo, tmp_path: Path) -> None:
    rows = [
        {"text": "good", "label": "pos"},
        {"text": "bad", "label": "neg"},
        {"text": "meh", "label": "mid"},
    ]
    data = task_data(demo, tmp_path, rows, rows[:2])
    assert data.label_names == ["mid", "neg", "pos"]
    assert [label for _, label in data.train] == [2, 1, 0]
    assert [label for _, label in data.val] == [2, 1]


def test_integer_labels_keep_their_values(demo, tmp_path: Path) -> None:
    data = task_data(demo, tmp_path, [{"text": "a", "label": 2}, {"text": "b", "label": 0}])
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
        task_data(demo, tmp_path, train, val)
    assert message in str(error.value)


def test_integer_labels_may_skip_a_few_ids(demo, tmp_path: Path) -> None:
    rows = [{"text": "a", "label": 0}, {"text": "b", "label": 1}, {"text": "c", "label": 50}]
    assert len(task_data(demo, tmp_path, rows).label_names) == 51


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
    bad = write_rows(tmp_path / "bad.jsonl", ['{"text": "fine", "label": "a"}'] * 30 + ['{"text": "cut sho'])
    result = run_launch([*demo[1], f"data.train_file={bad}", f"output_dir={tmp_path / 'out'}"])
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}:31: not valid JSON"), errors
    assert not (tmp_path / "out" / "checkpoints").exists()
