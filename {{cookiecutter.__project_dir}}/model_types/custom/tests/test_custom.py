"""Custom model type: the synthetic default, the .pt data format, its errors, final/, and predict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import METRIC, ON_THIS_MACHINE, read_metrics
from predict_helpers import prediction_error, predictions, run_predict
from safetensors.torch import load_file, load_model

from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.data.loader import DataError
from {{ cookiecutter.package_name }}.model_type import checks, task
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
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


# ---- python -m <package>.predict ------------------------------------------------------------------
def _inputs(path: Path, rows: int) -> Path:
    generator = torch.Generator().manual_seed(0)
    torch.save({"inputs": torch.randn(rows, task.MODEL_CONFIG["in_features"], generator=generator)}, path)
    return path


def test_predict_writes_a_class_and_score_per_row_in_order(demo, tmp_path: Path) -> None:
    """The demo checkpoint is a model folder as training saves final/; inputs need no targets."""
    model, inputs = demo[0] / "model", _inputs(tmp_path / "inputs.pt", 7)
    records = predictions(model, inputs, tmp_path / "all.jsonl", "--batch-size", "3", "--top-k", "4")
    assert len(records) == 7
    for record in records:
        assert record["label"] in range(task.MODEL_CONFIG["classes"]) and 0 < record["score"] <= 1
        assert sorted(pair["label"] for pair in record["scores"]) == [0, 1, 2, 3]
    rows = torch.load(inputs)["inputs"]
    for number in (0, 6):  # a row alone gets the record it got among the others
        torch.save({"inputs": rows[number : number + 1]}, tmp_path / "one.pt")
        alone = predictions(model, tmp_path / "one.pt", tmp_path / "one.jsonl", "--top-k", "4")[0]
        assert alone["label"] == records[number]["label"]
        assert alone["score"] == pytest.approx(records[number]["score"], abs=1e-6)


def test_predict_refuses_inputs_of_another_shape_in_one_line(demo, tmp_path: Path, capsys) -> None:
    torch.save({"inputs": torch.zeros(3, 5)}, tmp_path / "narrow.pt")
    error = prediction_error(demo[0] / "model", tmp_path / "narrow.pt", capsys)
    assert error == f"error: {tmp_path / 'narrow.pt'}: 'inputs' has shape (3, 5), expected (N, 32)"


def test_predict_refuses_a_folder_without_the_model(tmp_path: Path, capsys) -> None:
    error = prediction_error(tmp_path, _inputs(tmp_path / "inputs.pt", 2), capsys)
    assert error.startswith(f"error: {tmp_path}: no model.safetensors and config.json")


@pytest.mark.slow
def test_predict_with_the_trained_model_finds_the_validation_classes(
    demo, trained: Path, tmp_path: Path
) -> None:
    val, output = demo[0] / "val.pt", tmp_path / "predictions.jsonl"
    result = run_predict(str(trained / "final"), str(val), "--output", str(output))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    targets = torch.load(val)["targets"].tolist()
    assert len(records) == len(targets)
    assert (
        sum(record["label"] == target for record, target in zip(records, targets, strict=True)) / len(targets)
        > 0.5
    )
