"""Custom model type: the synthetic default, the .pt data format, its errors, and final/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, read_metrics
from safetensors.torch import load_file, load_model

from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.data import DataError
from {{ cookiecutter.package_name }}.distributed import DistEnv
from {{ cookiecutter.package_name }}.model_type import (
    checks,
    task,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _config(tmp_path: Path, *overrides: str):
    return load_config([*ON_THIS_MACHINE, f"output_dir={tmp_path / 'out'}", *overrides])


def test_synthetic_default_needs_no_files(tmp_path: Path) -> None:
    config = _config(tmp_path, "data.train_file=", "data.val_file=", "model.pretrained=")
    checks.check_config(config)
    data = task.build_data(config, ENV)
    assert len(data.train) == 2048 and len(data.val) == 509
    batch = data.collate([data.train[0], data.train[1]])
    assert batch["inputs"].shape == (2, task.MODEL_CONFIG["in_features"])
    model = task.build_model(config, data)
    assert task.loss_sum(model, batch).ndim == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"inputs": torch.zeros(3, 32)}, "expected a dict with 'inputs' and 'targets'"),
        ({"inputs": torch.zeros(3, 5), "targets": torch.zeros(3, dtype=torch.long)}, "expected (N, 32)"),
        ({"inputs": torch.zeros(3, 32), "targets": torch.zeros(3)}, "int64 tensor"),
        ({"inputs": torch.zeros(2, 32), "targets": torch.tensor([0, 9])}, "class ids in 0..3"),
    ],
)
def test_bad_data_files_are_named(tmp_path: Path, content: dict, message: str) -> None:
    path = tmp_path / "bad.pt"
    torch.save(content, path)
    with pytest.raises(DataError) as error:
        task.build_data(_config(tmp_path, f"data.train_file={path}"), ENV)
    assert str(path) in str(error.value) and message in str(error.value)


def test_unreadable_data_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "torn.pt"
    path.write_bytes(b"not a tensor file")
    with pytest.raises(DataError, match=r"torn\.pt: not a readable \.pt file"):
        task.build_data(_config(tmp_path, f"data.train_file={path}"), ENV)


def test_pretrained_directory_must_hold_weights(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no model\.safetensors"):
        checks.check_config(_config(tmp_path, f"model.pretrained={tmp_path}"))


@pytest.mark.slow
def test_final_weights_load_into_the_model(trained: Path) -> None:
    model = task.Model(**task.MODEL_CONFIG)
    model.load_state_dict(load_file(trained / "final" / "model.safetensors"))
    assert read_metrics(trained)[-1][METRIC] > 0.5  # the demo is learnable


class TiedModel(torch.nn.Module):
    """A language-model-like network whose output layer reuses the embedding (tied weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)
        self.output = torch.nn.Linear(4, 10, bias=False)
        self.output.weight = self.embedding.weight


def test_tied_weights_save_and_load(tmp_path: Path) -> None:
    model = TiedModel()
    task.save_weights(model, tmp_path)
    restored = TiedModel()
    missing, unexpected = load_model(restored, tmp_path / "model.safetensors")
    assert not missing and not unexpected
    assert torch.equal(restored.embedding.weight, model.embedding.weight)
    assert restored.output.weight is restored.embedding.weight  # still tied
