"""Loading images: flips for training only and the same in any worker, the cached file index, hub dataset
folders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from image_data import ENV, class_split, config_of, task_data, write_image
from PIL import Image
from torch.utils.data import DataLoader

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.data.loader import (
    DataError,
)
from {{ cookiecutter.package_name }}.model_type import task


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
    root = class_split(tmp_path / "data", {"a": 1, "b": 1})
    _left_half_white(root / "a" / "0.png")
    data = task_data(demo, tmp_path, root, root)
    assert 0 < sum(_mirrored_draws(data.train)) < 40
    assert not any(_mirrored_draws(data.val))
    assert not any(_mirrored_draws(task_data(demo, tmp_path, root, root, "data.augment=false").train))


def _mirrored_by_sample(dataset, workers: int) -> list[bool]:
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers, generator=torch.Generator().manual_seed(7)
    )
    return [_is_mirrored(pixels) for pixels, _ in loader]


def test_flips_in_workers_do_not_depend_on_which_worker_loads_the_sample(demo, tmp_path: Path) -> None:
    """What keeps a run resumed mid-epoch, whose samples go to other workers, bit-identical."""
    for number in range(12):
        _left_half_white(tmp_path / "data" / "ab"[number % 2] / f"{number}.png")
    dataset = task_data(demo, tmp_path, tmp_path / "data").train
    flips = _mirrored_by_sample(dataset, workers=1)
    assert 0 < sum(flips) < len(flips)
    assert flips == _mirrored_by_sample(dataset, workers=2)


def test_the_file_index_is_cached_and_notices_new_images(demo, tmp_path: Path) -> None:
    train = class_split(tmp_path / "train", {"a": 1, "b": 1})
    task_data(demo, tmp_path, train)
    write_image(train / "a" / "new.png")
    assert len(task_data(demo, tmp_path, train).train) == 3
    assert len(list((tmp_path / "out" / "cache").glob("image-classification-*"))) == 2


def _pixels_and_labels(dataset) -> tuple[torch.Tensor, list[int]]:
    samples = [dataset[index] for index in range(len(dataset))]
    return torch.stack([pixels for pixels, _ in samples]), [label for _, label in samples]


def test_a_hub_dataset_folder_reads_like_class_folders(demo, tmp_path: Path) -> None:
    import datasets

    train = class_split(tmp_path / "files" / "train", {"cat": 2, "dog": 1})
    val = class_split(tmp_path / "files" / "validation", {"dog": 1, "cat": 1})
    _left_half_white(train / "cat" / "0.png")
    reference = task_data(demo, tmp_path / "folders", train, val, "data.augment=false")
    # An image folder read by load_dataset: splits from the folder names, labels as a ClassLabel.
    hub = config_of(demo, tmp_path / "imagefolder", train, val, "data.augment=false")
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
    saved = config_of(demo, tmp_path / "saved-run", train, val, "data.augment=false", "data.val_split=test",
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

    good = write_image(tmp_path / "good.png").read_bytes()
    images = [{"bytes": good, "path": None}, {"bytes": b"broken", "path": None}]
    rows = datasets.Dataset.from_dict({"image": images, "label": [0, 1]}, features=datasets.Features(
        {"image": datasets.Image(), "label": datasets.Value("int64")}))  # fmt: skip
    rows.save_to_disk(tmp_path / "saved")
    config = config_of(demo, tmp_path, tmp_path, None, "data.val_split=")
    config.data.hub_dataset = str(tmp_path / "saved")
    data = task.build_data(config, ENV)
    data.train[0]
    with pytest.raises(DataError, match=r"saved\[train\]: row 2: cannot decode the image"):
        data.train[1]
