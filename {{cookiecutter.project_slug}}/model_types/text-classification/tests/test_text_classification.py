"""Text classification: the JSON Lines format, label mapping, bad-data errors, dynamic padding, final/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, read_metrics, run_launch

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import DataError
from {{ cookiecutter.package_name }}.distributed import DistEnv
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
    ],
)
def test_bad_data_names_file_and_line(demo, tmp_path: Path, train, val, message: str) -> None:
    with pytest.raises(DataError) as error:
        _data(demo, tmp_path, train, val)
    assert message in str(error.value)


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
