"""Image-classification data of the tests: images and class folders written here, configs on the demo
checkpoint, and the task's data built in this process."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import ON_THIS_MACHINE
from PIL import Image

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.model_type import task
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
RED = (255, 0, 0)


def write_image(path: Path, mode: str = "RGB", color: object = RED, size: tuple[int, int] = (20, 16)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).convert(mode).save(path)
    return path


def class_split(root: Path, classes: dict[str, int]) -> Path:
    for name, count in classes.items():
        for number in range(count):
            write_image(root / name / f"{number}.png")
    return root


def config_of(
    demo: tuple[Path, list[str]], tmp_path: Path, train: Path, val: Path | None = None, *extra: str
):
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


def task_data(demo, tmp_path: Path, train: Path, val: Path | None = None, *extra: str):
    return task.build_data(config_of(demo, tmp_path, train, val, *extra), ENV)
