"""Token-classification data of the tests: JSON Lines written from rows, configs on the demo checkpoint,
the task's data built in this process, and random tag sequences (malformed ones included)."""

from __future__ import annotations

import json
import random
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
# Every prefix in every order with two types, and tags of IOB1, IOB2, IOE and IOBES among them.
TAGS = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "I-MISC-X"]


def write_rows(path: Path, rows: list[object]) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def config_of(demo, directory: Path, *overrides: str):
    pretrained, output_dir = f"model.pretrained={demo[0] / 'model'}", f"output_dir={directory / 'out'}"
    return load_config([pretrained, output_dir, *ON_THIS_MACHINE, *overrides])


def task_data(demo, tmp_path: Path, train: list[object], val: list[object] | None = None, *overrides: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = [
        f"data.train_file={write_rows(tmp_path / 'train.jsonl', train)}",
        f"data.val_file={write_rows(tmp_path / 'val.jsonl', val) if val is not None else ''}",
    ]
    return task.build_data(config_of(demo, tmp_path, *files, *overrides), ENV)


def demo_rows(demo, count: int = 40) -> list[dict]:
    lines = (demo[0] / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:count]]


def samples_of(dataset) -> list[tuple[list[int], list[int], list[int]]]:
    return [(ids.tolist(), starts.tolist(), tags.tolist()) for ids, starts, tags in dataset]


def random_sentences(rng: random.Random, count: int, longest: int = 9) -> list[list[str]]:
    """Tag sequences of 0 to ``longest`` tags drawn at random: as malformed as tags get (I- after O,
    E- after B- of another type, S- inside an entity)."""
    return [[rng.choice(TAGS) for _ in range(rng.randint(0, longest))] for _ in range(count)]


def noisy_copy(rng: random.Random, sentences: list[list[str]], rate: float) -> list[list[str]]:
    """The sentences with a share of their tags replaced at random: predictions that are partly right."""
    return [[rng.choice(TAGS) if rng.random() < rate else tag for tag in tags] for tags in sentences]
