"""``python -m <package>.predict``: run the custom model on the ``inputs`` of a ``.pt`` data file (its
``targets``, if any, are ignored). Each record: ``label`` (the class id) and ``score``, plus ``scores``
with ``--top-k``. Change ``predict`` when your model is not a classifier. ``PREDICTION`` at the end
hands it to the shared command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model

from ..task import classification
from ..task.spec import PredictError, Prediction
from .task import Model, load_inputs


def read_inputs(path: Path) -> list[torch.Tensor]:
    return list(load_inputs(str(path))["inputs"].float())


class CustomPredictor:
    def __init__(self, model: Model, device: torch.device, top_k: int) -> None:
        self.model, self.device, self.top_k = model.to(device).eval(), device, top_k

    def prepare(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return inputs

    def length(self, item: torch.Tensor) -> int:
        return 1  # rows of one size: batches in input order

    def predict(self, batch: list[torch.Tensor]) -> list[dict[str, Any]]:
        logits = self.model(torch.stack(batch).to(self.device))
        return classification.prediction_records(logits, range(logits.shape[-1]), self.top_k)


def load(model_dir: Path, options: argparse.Namespace, device: torch.device) -> CustomPredictor:
    weights, config = model_dir / "model.safetensors", model_dir / "config.json"
    if not weights.is_file() or not config.is_file():
        raise PredictError(f"{model_dir}: no model.safetensors and config.json; pass a run's final/ folder")
    model = Model(**json.loads(config.read_text(encoding="utf-8")))
    try:
        load_model(model, str(weights))
    except RuntimeError as error:  # weights of another shape or model
        reason = str(error).strip().splitlines()[0]
        raise PredictError(f"{model_dir}: its weights do not fit the Model in task.py ({reason})") from None
    return CustomPredictor(model, device, options.top_k)


PREDICTION = Prediction(read_inputs=read_inputs, load=load, add_arguments=classification.add_top_k)
