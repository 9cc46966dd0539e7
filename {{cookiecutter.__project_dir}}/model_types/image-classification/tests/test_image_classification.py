"""Image classification: the folder format, class ids, RGB conversion, bad-data errors, final/."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import METRIC, read_metrics, run_launch
from image_data import class_split, config_of, task_data, write_image
from PIL import Image
from torch.utils.data import DataLoader

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    ConfigError,
)
from {{ cookiecutter.package_name }}.data.loader import (
    DataError,
)
from {{ cookiecutter.package_name }}.model_type import checks, task


def test_class_folders_get_sorted_ids(demo, tmp_path: Path) -> None:
    train = class_split(tmp_path / "train", {"zebra": 1, "cat": 2, "dog": 1})
    val = class_split(tmp_path / "val", {"dog": 1, "cat": 1})
    data = task_data(demo, tmp_path, train, val)
    assert data.label_names == ["cat", "dog", "zebra"]
    assert [data.train.labels[i] for i in range(4)] == [0, 0, 1, 2]
    assert [data.val.labels[i] for i in range(2)] == [0, 1]


def test_every_mode_and_format_becomes_rgb(demo, tmp_path: Path) -> None:
    train = tmp_path / "train"
    write_image(train / "a" / "rgba.png", "RGBA")
    write_image(train / "a" / "palette.png", "P")
    write_image(train / "a" / "photo.jpg")
    write_image(train / "b" / "gray.png", "L", color=(255, 255, 255))
    data = task_data(demo, tmp_path, train, None, "data.augment=false")
    batch = data.collate([data.train[index] for index in range(len(data.train))])
    assert batch["pixel_values"].shape == (4, 3, 32, 32)  # resized to the processor's size
    means = batch["pixel_values"].mean(dim=(2, 3))  # normalised with mean 0.5, std 0.5: 255 -> 1, 0 -> -1
    assert torch.allclose(means[:2], torch.tensor([1.0, -1.0, -1.0]), atol=0.01)  # rgba.png, palette.png
    assert torch.allclose(means[2], torch.tensor([1.0, -1.0, -1.0]), atol=0.1)  # photo.jpg, lossy
    assert torch.allclose(means[3], torch.ones(3), atol=0.01)  # gray.png
    assert batch["labels"].tolist() == [0, 0, 0, 1]


def test_image_processor_is_the_pil_backend(demo, tmp_path: Path) -> None:
    backends = pytest.importorskip("transformers.image_processing_backends")  # transformers >= 5
    data = task_data(demo, tmp_path, class_split(tmp_path / "train", {"a": 1, "b": 1}))
    assert isinstance(data.preprocessor, backends.PilBackend)


def _not_an_image(root: Path) -> str:
    class_split(root / "train", {"a": 1, "b": 1})
    (root / "train" / "b" / "fake.png").write_text("not an image")
    return f"{root / 'train' / 'b' / 'fake.png'}: not a readable image"


def _empty_class(root: Path) -> str:
    class_split(root / "train", {"a": 1, "b": 1})
    (root / "train" / "c").mkdir()
    (root / "train" / "c" / "notes.txt").write_text("no images here")
    return f"{root / 'train' / 'c'}: class folder without images"


def _one_class(root: Path) -> str:
    class_split(root / "train", {"a": 2})
    return f"{root / 'train'}: one class folder (a); a classifier needs at least 2 classes"


def _no_class_folders(root: Path) -> str:
    write_image(root / "train" / "loose.png")
    return f"{root / 'train'}: no class folders"


def _unseen_val_class(root: Path) -> str:
    class_split(root / "train", {"a": 1, "b": 1})
    class_split(root / "val", {"a": 1, "c": 1})
    return f"{root / 'val' / 'c'}: class 'c' has no folder in data.train_file"


@pytest.mark.parametrize(
    "make", [_not_an_image, _empty_class, _one_class, _no_class_folders, _unseen_val_class]
)
def test_bad_data_names_the_file_or_folder(demo, tmp_path: Path, make) -> None:
    message = make(tmp_path)
    val = tmp_path / "val" if (tmp_path / "val").exists() else None
    with pytest.raises(DataError) as error:
        task_data(demo, tmp_path, tmp_path / "train", val)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("key", ["data.train_file", "data.val_file"])
def test_missing_folder_or_a_file_is_refused_before_training(demo, tmp_path: Path, key: str) -> None:
    train = class_split(tmp_path / "train", {"a": 1, "b": 1})
    paths = {"data.train_file": train, "data.val_file": train}
    for wrong, message in [(tmp_path / "nowhere", "does not exist"), (train / "a" / "0.png", "is a file")]:
        paths[key] = wrong
        config = config_of(demo, tmp_path, paths["data.train_file"], paths["data.val_file"])
        with pytest.raises(ConfigError, match=f"{key}=.*{message}"):
            checks.check_config(config)


@pytest.mark.parametrize(
    ("others", "entries"),
    [(1, "1 entry that is not an image file"), (2, "2 entries that are not image files")],
)
def test_other_files_are_skipped_with_one_warning(
    demo, tmp_path: Path, caplog, others: int, entries: str
) -> None:
    train = class_split(tmp_path / "train", {"a": 1, "b": 1})
    for number in range(others):
        (train / "a" / f"notes{number}.txt").write_text("")
    (train / "a" / ".DS_Store").write_text("")
    (train / ".hidden-class").mkdir()
    with caplog.at_level(logging.WARNING):
        data = task_data(demo, tmp_path, train)
    assert len(data.train) == 2
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING] == [
        f"skipped {entries} in a class folder, e.g. {train / 'a' / 'notes0.txt'}"
    ]


def _truncated_image_data(demo, tmp_path: Path, workers: int):
    train = class_split(tmp_path / "train", {"a": 1, "b": 1})
    broken = write_image(train / "b" / "broken.png", size=(64, 64))
    broken.write_bytes(broken.read_bytes()[:60])  # the header still reads; the pixels do not
    data = task_data(demo, tmp_path, train)
    loader = DataLoader(data.train, batch_size=3, num_workers=workers, collate_fn=data.collate)
    return broken, loader


@pytest.mark.parametrize("workers", [0, 1])
def test_decode_failure_names_the_image_in_one_line(demo, tmp_path: Path, workers: int) -> None:
    broken, loader = _truncated_image_data(demo, tmp_path, workers)
    with pytest.raises(DataError) as error:
        next(iter(loader))
    assert str(error.value).startswith(f"{broken}: cannot decode the image")
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_final_model_loads_with_auto_classes_and_keeps_class_names(trained: Path) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    final = trained / "final"
    model = AutoModelForImageClassification.from_pretrained(final)
    processor = AutoImageProcessor.from_pretrained(final, **task.PIL_PROCESSOR)
    assert model.config.id2label == {0: "bottom", 1: "middle", 2: "top"}
    with torch.no_grad():
        logits = model(**processor(images=Image.new("RGB", (40, 30)), return_tensors="pt")).logits
    assert logits.shape == (1, 3)
    assert read_metrics(trained)[-1][METRIC] > 0.5  # the demo is learnable


@pytest.mark.slow
def test_decode_failure_in_a_worker_ends_launch_naming_the_image(demo, tmp_path: Path) -> None:
    directory, overrides = demo
    train = shutil.copytree(directory / "train", tmp_path / "train")
    broken = sorted((train / "top").glob("*.png"))[0]
    broken.write_bytes(broken.read_bytes()[:60])
    result = run_launch(
        [*overrides, f"data.train_file={train}", f"output_dir={tmp_path / 'out'}", "data.num_workers=1"]
    )
    assert result.returncode != 0
    assert f"error: {broken}: cannot decode the image" in result.stderr
