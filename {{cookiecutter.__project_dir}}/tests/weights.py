"""The weights of finished runs, compared bit for bit, and the demo checkpoint without dropout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "final" / "model.safetensors")


def assert_same_weights(expected: Path, actual: Path) -> None:
    reference, result = final_weights(expected), final_weights(actual)
    assert reference.keys() == result.keys()
    for name in reference:
        assert torch.equal(reference[name], result[name]), f"{name} differs"


def without_dropout(model_dir: Path, copy: Path) -> Path:
    """The demo checkpoint with every dropout rate at 0: runs then differ only by the arithmetic."""
    shutil.copytree(model_dir, copy)
    config_file = copy / "config.json"
    config = json.loads(config_file.read_text())
    for key, value in config.items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            config[key] = 0.0
    config_file.write_text(json.dumps(config))
    return copy
