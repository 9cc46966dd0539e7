"""``python -m <package>.predict``: classify the texts of a JSON Lines file (``text``; a ``label`` is
ignored) with a fine-tuned sequence classifier. Each record: ``label`` and ``score``, plus ``scores``
with ``--top-k``. ``PREDICTION`` at the end hands it to the shared command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ..data.loader import DataError, iter_jsonl, to_device
from ..task import classification
from ..task.hugging_face import load_fine_tuned, load_preprocessor
from ..task.spec import Prediction
from .task import Collator, with_pad_token


def read_inputs(path: Path) -> list[str]:
    texts = []
    for row in iter_jsonl(path, ("text",)):
        if not isinstance(row["text"], str):
            raise DataError(f"{path}:{row['_line']}: field 'text' must be a string")
        texts.append(row["text"])
    return texts


class TextClassifier:
    def __init__(self, model: Any, tokenizer: Any, device: torch.device, top_k: int) -> None:
        self.model, self.tokenizer, self.device, self.top_k = model.to(device), tokenizer, device, top_k
        self.names = classification.class_names(model.config.id2label)
        self.collate = Collator(tokenizer.pad_token_id)
        limits = [tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None)]
        # transformers' "no limit" sentinel is a huge number; texts longer than the model's limit are cut.
        self.max_length = min(limit for limit in limits if isinstance(limit, int) and limit < 1_000_000)

    def prepare(self, inputs: list[str]) -> list[list[int]]:
        return self.tokenizer(inputs, truncation=True, max_length=self.max_length)["input_ids"]

    def length(self, item: list[int]) -> int:
        return len(item)

    def predict(self, batch: list[list[int]]) -> list[dict[str, Any]]:
        encoded = to_device(self.collate([(ids, 0) for ids in batch]), self.device)
        logits = self.model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
        return classification.prediction_records(logits, self.names, self.top_k)


def load(model_dir: Path, options: argparse.Namespace, device: torch.device) -> TextClassifier:
    model = load_fine_tuned(AutoModelForSequenceClassification, model_dir, "text classifier")
    tokenizer = with_pad_token(load_preprocessor(AutoTokenizer, model_dir))
    return TextClassifier(model, tokenizer, device, options.top_k)


PREDICTION = Prediction(read_inputs=read_inputs, load=load, add_arguments=classification.add_top_k)
