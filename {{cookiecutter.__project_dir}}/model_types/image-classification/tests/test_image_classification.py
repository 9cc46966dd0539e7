"""Image classification: the folder format, class ids, RGB conversion, bad-data errors, flips, final/,
and predict on folders and lists of images."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, read_metrics, run_launch
from PIL import Image
from predict_helpers import prediction_error, predictions, run_predict
from torch.utils.data import DataLoader

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.data import (
    DataError,
)
from {{ cookiecutter.package_name }}.distributed import (
    DistEnv,
)
from {{ cookiecutter.package_name }}.model_type import (
    checks,
    task,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
RED = (255, 0, 0)


def _image(path: Path, mode: str = "RGB", color: object = RED, size: tuple[int, int] = (20, 16)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).convert(mode).save(path)
    return path


def _split(root: Path, classes: dict[str, int]) -> Path:
    for name, count in classes.items():
        for number in range(count):
            _image(root / name / f"{number}.png")
    return root


def _config(demo: tuple[Path, list[str]], tmp_path: Path, train: Path, val: Path | None = None, *extra: str):
    directory, _ = demo
    return load_config(
        [
            f"model.pretrained={directory / 'model'}",
            f"data.train_file={train}",
            f"data.val_file={val or ''}",
            f"output_dir={tmp_path / 'out'}",
            *ON_THIS_MACHINE,
            *extra,
        ]
    )


def _data(demo, tmp_path: Path, train: Path, val: Path | None = None, *extra: str):
    return task.build_data(_config(demo, tmp_path, train, val, *extra), ENV)


def test_class_folders_get_sorted_ids(demo, tmp_path: Path) -> None:
    train = _split(tmp_path / "train", {"zebra": 1, "cat": 2, "dog": 1})
    val = _split(tmp_path / "val", {"dog": 1, "cat": 1})
    data = _data(demo, tmp_path, train, val)
    assert data.label_names == ["cat", "dog", "zebra"]
    assert [data.train.labels[i] for i in range(4)] == [0, 0, 1, 2]
    assert [data.val.labels[i] for i in range(2)] == [0, 1]


def test_every_mode_and_format_becomes_rgb(demo, tmp_path: Path) -> None:
    train = tmp_path / "train"
    _image(train / "a" / "rgba.png", "RGBA")
    _image(train / "a" / "palette.png", "P")
    _image(train / "a" / "photo.jpg")
    _image(train / "b" / "gray.png", "L", color=(255, 255, 255))
    data = _data(demo, tmp_path, train, None, "data.augment=false")
    batch = data.collate([data.train[index] for index in range(len(data.train))])
    assert batch["pixel_values"].shape == (4, 3, 32, 32)  # resized to the processor's size
    means = batch["pixel_values"].mean(dim=(2, 3))  # normalised with mean 0.5, std 0.5: 255 -> 1, 0 -> -1
    assert torch.allclose(means[:2], torch.tensor([1.0, -1.0, -1.0]), atol=0.01)  # rgba.png, palette.png
    assert torch.allclose(means[2], torch.tensor([1.0, -1.0, -1.0]), atol=0.1)  # photo.jpg, lossy
    assert torch.allclose(means[3], torch.ones(3), atol=0.01)  # gray.png
    assert batch["labels"].tolist() == [0, 0, 0, 1]


def test_image_processor_is_the_pil_backend(demo, tmp_path: Path) -> None:
    backends = pytest.importorskip("transformers.image_processing_backends")  # transformers >= 5
    data = _data(demo, tmp_path, _split(tmp_path / "train", {"a": 1, "b": 1}))
    assert isinstance(data.preprocessor, backends.PilBackend)


def _not_an_image(root: Path) -> str:
    _split(root / "train", {"a": 1, "b": 1})
    (root / "train" / "b" / "fake.png").write_text("not an image")
    return f"{root / 'train' / 'b' / 'fake.png'}: not a readable image"


def _empty_class(root: Path) -> str:
    _split(root / "train", {"a": 1, "b": 1})
    (root / "train" / "c").mkdir()
    (root / "train" / "c" / "notes.txt").write_text("no images here")
    return f"{root / 'train' / 'c'}: class folder without images"


def _one_class(root: Path) -> str:
    _split(root / "train", {"a": 2})
    return f"{root / 'train'}: one class folder (a); a classifier needs at least 2 classes"


def _no_class_folders(root: Path) -> str:
    _image(root / "train" / "loose.png")
    return f"{root / 'train'}: no class folders"


def _unseen_val_class(root: Path) -> str:
    _split(root / "train", {"a": 1, "b": 1})
    _split(root / "val", {"a": 1, "c": 1})
    return f"{root / 'val' / 'c'}: class 'c' has no folder in data.train_file"


@pytest.mark.parametrize(
    "make", [_not_an_image, _empty_class, _one_class, _no_class_folders, _unseen_val_class]
)
def test_bad_data_names_the_file_or_folder(demo, tmp_path: Path, make) -> None:
    message = make(tmp_path)
    val = tmp_path / "val" if (tmp_path / "val").exists() else None
    with pytest.raises(DataError) as error:
        _data(demo, tmp_path, tmp_path / "train", val)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("key", ["data.train_file", "data.val_file"])
def test_missing_folder_or_a_file_is_refused_before_training(demo, tmp_path: Path, key: str) -> None:
    train = _split(tmp_path / "train", {"a": 1, "b": 1})
    paths = {"data.train_file": train, "data.val_file": train}
    for wrong, message in [(tmp_path / "nowhere", "does not exist"), (train / "a" / "0.png", "is a file")]:
        paths[key] = wrong
        config = _config(demo, tmp_path, paths["data.train_file"], paths["data.val_file"])
        with pytest.raises(ConfigError, match=f"{key}=.*{message}"):
            checks.check_config(config)


@pytest.mark.parametrize(
    ("others", "entries"),
    [(1, "1 entry that is not an image file"), (2, "2 entries that are not image files")],
)
def test_other_files_are_skipped_with_one_warning(
    demo, tmp_path: Path, caplog, others: int, entries: str
) -> None:
    train = _split(tmp_path / "train", {"a": 1, "b": 1})
    for number in range(others):
        (train / "a" / f"notes{number}.txt").write_text("")
    (train / "a" / ".DS_Store").write_text("")
    (train / ".hidden-class").mkdir()
    with caplog.at_level(logging.WARNING):
        data = _data(demo, tmp_path, train)
    assert len(data.train) == 2
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING] == [
        f"skipped {entries} in a class folder, e.g. {train / 'a' / 'notes0.txt'}"
    ]


def _truncated_image_data(demo, tmp_path: Path, workers: int):
    train = _split(tmp_path / "train", {"a": 1, "b": 1})
    broken = _image(train / "b" / "broken.png", size=(64, 64))
    broken.write_bytes(broken.read_bytes()[:60])  # the header still reads; the pixels do not
    data = _data(demo, tmp_path, train)
    loader = DataLoader(data.train, batch_size=3, num_workers=workers, collate_fn=data.collate)
    return broken, loader


@pytest.mark.parametrize("workers", [0, 1])
def test_decode_failure_names_the_image_in_one_line(demo, tmp_path: Path, workers: int) -> None:
    broken, loader = _truncated_image_data(demo, tmp_path, workers)
    with pytest.raises(DataError) as error:
        next(iter(loader))
    assert str(error.value).startswith(f"{broken}: cannot decode the image")
    assert "\n" not in str(error.value)


def _left_half_white(path: Path) -> None:
    image = Image.new("L", (32, 32))
    image.paste(255, (0, 0, 16, 32))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def _is_mirrored(pixels: torch.Tensor) -> bool:
    return bool(pixels[0, :, -1].mean() > 0)  # white on the right


def _mirrored_draws(dataset) -> list[bool]:
    return [_is_mirrored(dataset[0][0]) for _ in range(40)]


def test_augmentation_flips_training_images_only(demo, tmp_path: Path) -> None:
    root = _split(tmp_path / "data", {"a": 1, "b": 1})
    _left_half_white(root / "a" / "0.png")
    data = _data(demo, tmp_path, root, root)
    assert 0 < sum(_mirrored_draws(data.train)) < 40
    assert not any(_mirrored_draws(data.val))
    assert not any(_mirrored_draws(_data(demo, tmp_path, root, root, "data.augment=false").train))


def _mirrored_by_sample(dataset, workers: int) -> list[bool]:
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers, generator=torch.Generator().manual_seed(7)
    )
    return [_is_mirrored(pixels) for pixels, _ in loader]


def test_flips_in_workers_do_not_depend_on_which_worker_loads_the_sample(demo, tmp_path: Path) -> None:
    """What keeps a run resumed mid-epoch, whose samples go to other workers, bit-identical."""
    for number in range(12):
        _left_half_white(tmp_path / "data" / "ab"[number % 2] / f"{number}.png")
    dataset = _data(demo, tmp_path, tmp_path / "data").train
    flips = _mirrored_by_sample(dataset, workers=1)
    assert 0 < sum(flips) < len(flips)
    assert flips == _mirrored_by_sample(dataset, workers=2)


def test_the_file_index_is_cached_and_notices_new_images(demo, tmp_path: Path) -> None:
    train = _split(tmp_path / "train", {"a": 1, "b": 1})
    _data(demo, tmp_path, train)
    _image(train / "a" / "new.png")
    assert len(_data(demo, tmp_path, train).train) == 3
    assert len(list((tmp_path / "out" / "cache").glob("image-classification-*"))) == 2


def _pixels_and_labels(dataset) -> tuple[torch.Tensor, list[int]]:
    samples = [dataset[index] for index in range(len(dataset))]
    return torch.stack([pixels for pixels, _ in samples]), [label for _, label in samples]


def test_a_hub_dataset_folder_reads_like_class_folders(demo, tmp_path: Path) -> None:
    import datasets

    train = _split(tmp_path / "files" / "train", {"cat": 2, "dog": 1})
    val = _split(tmp_path / "files" / "validation", {"dog": 1, "cat": 1})
    _left_half_white(train / "cat" / "0.png")
    reference = _data(demo, tmp_path / "folders", train, val, "data.augment=false")
    # An image folder read by load_dataset: splits from the folder names, labels as a ClassLabel.
    hub = _config(demo, tmp_path / "imagefolder", train, val, "data.augment=false")
    hub.data.hub_dataset = str(tmp_path / "files")
    # One saved with save_to_disk: images stored in the Arrow file, names as strings, other columns.
    rows = {
        name: datasets.Dataset.from_dict(
            {"picture": sorted(str(path) for path in root.rglob("*.png")),
             "kind": [path.parent.name for path in sorted(root.rglob("*.png"))]}
        ).cast_column("picture", datasets.Image()).map(lambda row: row)  # embeds the bytes
        for name, root in (("train", train), ("test", val))
    }  # fmt: skip
    datasets.DatasetDict(rows).save_to_disk(tmp_path / "saved")
    saved = _config(demo, tmp_path / "saved-run", train, val, "data.augment=false", "data.val_split=test",
                    "data.image_field=picture", "data.label_field=kind")  # fmt: skip
    saved.data.hub_dataset = str(tmp_path / "saved")
    for config in (hub, saved):
        data = task.build_data(config, ENV)
        assert data.label_names == reference.label_names == ["cat", "dog"]
        for split in ("train", "val"):
            pixels, labels = _pixels_and_labels(getattr(data, split))
            expected_pixels, expected_labels = _pixels_and_labels(getattr(reference, split))
            assert labels == expected_labels and torch.equal(pixels, expected_pixels), split


def test_a_hub_image_that_does_not_decode_is_named_by_row(demo, tmp_path: Path) -> None:
    import datasets

    good = _image(tmp_path / "good.png").read_bytes()
    images = [{"bytes": good, "path": None}, {"bytes": b"broken", "path": None}]
    rows = datasets.Dataset.from_dict({"image": images, "label": [0, 1]}, features=datasets.Features(
        {"image": datasets.Image(), "label": datasets.Value("int64")}))  # fmt: skip
    rows.save_to_disk(tmp_path / "saved")
    config = _config(demo, tmp_path, tmp_path, None, "data.val_split=")
    config.data.hub_dataset = str(tmp_path / "saved")
    data = task.build_data(config, ENV)
    data.train[0]
    with pytest.raises(DataError, match=r"saved\[train\]: row 2: cannot decode the image"):
        data.train[1]


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


# ---- python -m <package>.predict ------------------------------------------------------------------
def test_predict_classifies_every_image_of_a_folder_in_sorted_order(demo, tmp_path: Path) -> None:
    """The demo checkpoint is an image classifier as training saves one (its five classes included)."""
    images = _split(tmp_path / "images", {"b": 2, "a": 1})
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
    images = _split(tmp_path / "images", {"a": 2})
    listing = images / "list.txt"
    listing.write_text("a/1.png\n\na/0.png\n")
    records = predictions(demo[0] / "model", listing, tmp_path / "predictions.jsonl")
    assert [record["image"] for record in records] == [
        str(images / "a" / "1.png"),
        str(images / "a" / "0.png"),
    ]


def _broken_image(root: Path) -> tuple[Path, str]:
    broken = _image(root / "a" / "broken.png")
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
    inputs, message = make(_split(tmp_path / "images", {"a": 1}))
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
