"""A starting checkpoint for the custom model and synthetic data files in the ``.pt`` format it reads."""

from __future__ import annotations

from pathlib import Path

import torch

from .task import MODEL_CONFIG, Model, save_weights, synthetic_split

# Overrides that make two runs on the demo differ by their arithmetic only: none needed here.
REPRODUCIBLE: list[str] = []


def build(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, seed, size in (("train.pt", 0, 1024), ("val.pt", 1, 203)):
        inputs, targets = synthetic_split(seed, size).tensors
        torch.save({"inputs": inputs, "targets": targets}, directory / name)
    model_dir = directory / "model"
    model_dir.mkdir(exist_ok=True)
    torch.manual_seed(0)
    save_weights(Model(**MODEL_CONFIG), model_dir)
    return [
        f"model.pretrained={model_dir}",
        f"data.train_file={directory / 'train.pt'}",
        f"data.val_file={directory / 'val.pt'}",
        "output_dir=outputs/demo",
        "data.batch_size=32",
        "train.epochs=3",
        "train.lr=3e-3",
        "data.num_workers=0",
    ]
