"""Text-classification data of the tests: JSON Lines written from rows, configs on the demo checkpoint, and
the task's data built in this process."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import ON_THIS_MACHINE

from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.model_type import task
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def write_rows(path: Path, rows: list[object]) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def task_data(
    demo: tuple[Path, list[str]], tmp_path: Path, train: list[object], val: list[object] | None = None
):
    directory, _ = demo
    tmp_path.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"model.pretrained={directory / 'model'}",
        f"data.train_file={write_rows(tmp_path / 'train.jsonl', train)}",
        f"data.val_file={write_rows(tmp_path / 'val.jsonl', val) if val is not None else ''}",
        f"output_dir={tmp_path / 'out'}",
        *ON_THIS_MACHINE,
    ]
    return task.build_data(load_config(overrides), ENV)


def config_overrides(demo, directory: Path, *overrides: str) -> list[str]:
    return [
        f"model.pretrained={demo[0] / 'model'}",
        f"output_dir={directory / 'out'}",
        *ON_THIS_MACHINE,
        *overrides,
    ]


def config_of(demo, tmp_path: Path, *overrides: str):
    return load_config(config_overrides(demo, tmp_path, *overrides))


def samples_of(dataset) -> list[tuple[list[int], int]]:
    return [(ids.tolist(), label) for ids, label in dataset]


def demo_rows(demo) -> list[dict]:
    lines = (demo[0] / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:40]]
