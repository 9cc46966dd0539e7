"""Sequence-to-sequence data of the tests: JSON Lines written from rows, configs on the demo checkpoint,
the task's data built in this process, and the evaluation of a model over it as the loop runs it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import ON_THIS_MACHINE

from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.data.sampling import (
    EvalBatches,
)
from {{ cookiecutter.package_name }}.model_type import (
    task,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def write_rows(path: Path, rows: list[object]) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def config_of(demo, tmp_path: Path, *overrides: str):
    directory, _ = demo
    return load_config(
        [
            f"model.pretrained={directory / 'model'}",
            f"data.train_file={directory / 'train.jsonl'}",
            f"data.val_file={directory / 'val.jsonl'}",
            f"output_dir={tmp_path / 'out'}",
            *ON_THIS_MACHINE,
            "train.precision=fp32",
            *overrides,
        ]
    )


def data_of(demo, tmp_path: Path, train: list[object], val: list[object] | None = None, *overrides: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = [
        f"data.train_file={write_rows(tmp_path / 'train.jsonl', train)}",
        f"data.val_file={write_rows(tmp_path / 'val.jsonl', val) if val is not None else ''}",
    ]
    return task.build_data(config_of(demo, tmp_path, *files, *overrides), ENV)


def samples_of(dataset) -> list[tuple[list[int], ...]]:
    return [tuple(part if isinstance(part, str) else part.tolist() for part in item) for item in dataset]


def demo_rows(demo, split: str = "train", count: int = 40) -> list[dict]:
    lines = (demo[0] / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:count]]


def evaluation_totals(model, data, world_size: int, batch_size: int) -> dict[str, float]:
    """The sums loop/evaluation.py reduces, of every rank of a run of ``world_size`` processes: each rank's
    batches as EvalBatches gives them, added row by row in global batch order, as the all-reduce does."""
    rows: dict[int, dict[str, float]] = {}
    for rank in range(world_size):
        env = DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"))
        batches = EvalBatches(len(data.val), batch_size, env, lengths=data.val_lengths)
        for batch_id, indices in zip(batches.batch_ids, batches, strict=True):
            batch = data.collate([data.val[index] for index in indices])
            with torch.no_grad():
                sums = task.evaluation_sums(model, batch)
            rows[batch_id] = {name: float(value) for name, value in sums.items()}
    return {name: sum(rows[batch][name] for batch in sorted(rows)) for name in task.TASK.sum_names}
