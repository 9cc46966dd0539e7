"""python -m <package>.predict on images: a folder or a list of paths, in order, and bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from image_data import class_split, write_image
from predict_helpers import prediction_error, predictions, run_predict

# One name per line (kept so by the trailing commas): the package name may be long.


# ---- python -m <package>.predict ------------------------------------------------------------------
def test_predict_classifies_every_image_of_a_folder_in_sorted_order(demo, tmp_path: Path) -> None:
    """The demo checkpoint is an image classifier as training saves one (its five classes included)."""
    images = class_split(tmp_path / "images", {"b": 2, "a": 1})
    (images / "a" / "notes.txt").write_text("")
    output = tmp_path / "predictions.jsonl"
    records = predictions(demo[0] / "model", images, output, "--batch-size", "2", "--top-k", "2")
    assert [record["image"] for record in records] == [
        str(images / "a" / "0.png"),
        *(str(images / "b" / f"{n}.png") for n in range(2)),
    ]
    labels = {f"LABEL_{index}" for index in range(5)}
    for record in records:
        assert record["label"] in labels and 0 < record["score"] <= 1
        assert len(record["scores"]) == 2 and record["scores"][0]["label"] == record["label"]


def test_predict_reads_a_list_of_image_paths_relative_to_it(demo, tmp_path: Path) -> None:
    images = class_split(tmp_path / "images", {"a": 2})
    listing = images / "list.txt"
    listing.write_text("a/1.png\n\na/0.png\n")
    records = predictions(demo[0] / "model", listing, tmp_path / "predictions.jsonl")
    assert [record["image"] for record in records] == [
        str(images / "a" / "1.png"),
        str(images / "a" / "0.png"),
    ]


def _broken_image(root: Path) -> tuple[Path, str]:
    broken = write_image(root / "a" / "broken.png")
    broken.write_bytes(b"not an image")
    return root, f"{broken}: not a readable image"


def _missing_listed(root: Path) -> tuple[Path, str]:
    (root / "list.txt").write_text("a/0.png\na/gone.png\n")
    return root / "list.txt", f"{root / 'list.txt'}:2: {root / 'a' / 'gone.png'} does not exist"


def _no_images(root: Path) -> tuple[Path, str]:
    (root / "empty" / "sub").mkdir(parents=True)
    return root / "empty", f"{root / 'empty'}: no images"


@pytest.mark.parametrize("make", [_broken_image, _missing_listed, _no_images])
def test_predict_names_bad_input_in_one_line(demo, tmp_path: Path, capsys, make) -> None:
    inputs, message = make(class_split(tmp_path / "images", {"a": 1}))
    assert prediction_error(demo[0] / "model", inputs, capsys).startswith(f"error: {message}")


@pytest.mark.slow
def test_predict_with_the_trained_model_finds_the_validation_classes(
    demo, trained: Path, tmp_path: Path
) -> None:
    val, output = demo[0] / "val", tmp_path / "predictions.jsonl"
    result = run_predict(str(trained / "final"), str(val), "--output", str(output))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(list(val.glob("*/*")))
    correct = sum(Path(record["image"]).parent.name == record["label"] for record in records)
    assert correct / len(records) > 0.5
