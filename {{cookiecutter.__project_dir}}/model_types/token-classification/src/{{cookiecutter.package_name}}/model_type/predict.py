"""``python -m <package>.predict``: tag the sentences of a JSON Lines file (``tokens``, a list of words; a
``tags`` field is ignored) with a fine-tuned token classifier. Each record: the ``tokens`` as given and
their ``tags``, one per word, read off each word's first token; words past the model's length limit are
tagged ``O``. ``PREDICTION`` at the end hands it to the shared command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForTokenClassification

from ..data.loader import DataError, iter_jsonl, to_device
from ..task.hugging_face import load_fine_tuned
from ..task.spec import PredictError, Prediction
from .alignment import IDS_ONLY, Collator, Sample, word_starts
from .entities import OUTSIDE
from .scoring import logits, tag_names, word_predictions
from .tagged_data import is_string_list

Item = tuple[list[str], Sequence[int], Sequence[int]]  # words, token ids, word starts


def read_inputs(path: Path) -> list[list[str]]:
    sentences = []
    for row in iter_jsonl(path, ("tokens",)):
        if not is_string_list(row["tokens"]):
            raise DataError(f"{path}:{row['_line']}: field 'tokens' must be a list of strings")
        if not row["tokens"]:
            raise DataError(f"{path}:{row['_line']}: field 'tokens' is an empty list; give it the words")
        sentences.append(row["tokens"])
    return sentences


class Tagger:
    def __init__(self, model: Any, tokenizer: Any, device: torch.device) -> None:
        self.model, self.tokenizer, self.device = model.to(device), tokenizer, device
        self.names = tag_names(model)
        self.collate = Collator(tokenizer.pad_token_id)
        limits = [tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", None)]
        # transformers' "no limit" sentinel is a huge number; sentences longer than the model's limit are cut.
        self.max_length = min(limit for limit in limits if isinstance(limit, int) and limit < 1_000_000)

    def prepare(self, inputs: list[list[str]]) -> list[Item]:
        encoded = self.tokenizer(
            inputs, is_split_into_words=True, truncation=True, max_length=self.max_length, **IDS_ONLY
        )
        return [
            (words, ids, word_starts(encoded.word_ids(row), len(words)))
            for row, (words, ids) in enumerate(zip(inputs, encoded["input_ids"], strict=True))
        ]

    def length(self, item: Item) -> int:
        return len(item[1])

    def predict(self, batch: list[Item]) -> list[dict[str, Any]]:
        samples: list[Sample] = [(ids, starts, [0] * len(words)) for words, ids, starts in batch]
        encoded = to_device(self.collate(samples), self.device)
        outside = self.names.index(OUTSIDE) if OUTSIDE in self.names else len(self.names)
        predicted = word_predictions(logits(self.model, encoded), encoded, outside).tolist()
        return [
            {"tokens": words, "tags": [self.name(tag) for tag in row[: len(words)]]}
            for (words, _, _), row in zip(batch, predicted, strict=True)
        ]

    def name(self, tag: int) -> str:
        return self.names[tag] if tag < len(self.names) else OUTSIDE


def load(model_dir: Path, options: argparse.Namespace, device: torch.device) -> Tagger:
    from .task import load_tokenizer

    model = load_fine_tuned(AutoModelForTokenClassification, model_dir, "token classifier")
    try:
        tokenizer = load_tokenizer(model_dir)
    except (OSError, ValueError, KeyError) as error:
        lines = str(error).strip().splitlines()
        raise PredictError(
            f"{model_dir}: cannot load its tokenizer ({lines[0] if lines else error})"
        ) from None
    return Tagger(model, tokenizer, device)


PREDICTION = Prediction(read_inputs=read_inputs, load=load)
