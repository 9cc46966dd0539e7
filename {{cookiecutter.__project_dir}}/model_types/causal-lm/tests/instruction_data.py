"""Instruction data of the tests: records written here, the task's data built on the demo checkpoint, and
the target tokens of a sample."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import ON_THIS_MACHINE

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.model_type import (
    instructions,
    task,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
IGNORE = instructions.IGNORE_INDEX


def write_rows(path: Path, rows: list[object]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def task_data(demo, tmp_path: Path, train: str | list[object], *extra: str):
    """The task's data for a training file (a demo file's name, or records), without validation."""
    directory, _ = demo
    train_file = directory / train if isinstance(train, str) else write_rows(tmp_path / "train.jsonl", train)
    config = load_config(
        [
            f"model.pretrained={directory / 'model'}",
            f"data.train_file={train_file}",
            "data.val_file=",
            f"data.chat_template={directory / 'chat_template.jinja'}",
            f"output_dir={tmp_path / 'out'}",
            *ON_THIS_MACHINE,
            "data.max_length=128",
            *extra,
        ]
    )
    return task.build_data(config, ENV)


def targets_of(sample: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    ids, labels = sample
    return [int(token) for token, label in zip(ids, labels, strict=True) if label != IGNORE]
