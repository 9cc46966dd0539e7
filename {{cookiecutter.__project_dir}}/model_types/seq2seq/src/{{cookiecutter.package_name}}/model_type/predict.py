"""``python -m <package>.predict``: write a target for every source of a JSON Lines file (``source``; a
``target`` is ignored) with a fine-tuned sequence-to-sequence model. Each record: ``target``, the generated
text. By default exactly what evaluation generated: the run's source prefix and length, and its
``eval.max_new_tokens`` and ``eval.num_beams``, all read from the model folder. ``PREDICTION`` at the end
hands it to the shared command."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from ..config.cli import whole_number
from ..data.loader import DataError, iter_jsonl, to_device
from ..task.hugging_face import load_fine_tuned, load_preprocessor
from ..task.spec import PredictError, Prediction
from .generation import SOURCE_LENGTH_KEY, Settings, apply_settings, encode_sources, generate_texts
from .task import Collator, decoder_start_token, with_pad_token

FIELD = "source"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-new-tokens",
        type=whole_number(1),
        default=None,
        metavar="N",
        help="tokens to generate at most (default: the training run's eval.max_new_tokens)",
    )
    parser.add_argument(
        "--num-beams",
        type=whole_number(1),
        default=None,
        metavar="B",
        help="beams of the search, 1 = greedy (default: the training run's eval.num_beams)",
    )


def read_inputs(path: Path) -> list[str]:
    sources = []
    for row in iter_jsonl(path, (FIELD,)):
        value = row[FIELD]
        if not isinstance(value, str):
            raise DataError(f"{path}:{row['_line']}: field {FIELD!r} must be a string")
        if not value.strip():
            raise DataError(f"{path}:{row['_line']}: field {FIELD!r} is empty; give every line a source")
        sources.append(value)
    return sources


class Writer:
    """Batches of sources, encoded and generated from as evaluation does."""

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, settings: Settings) -> None:
        self.model, self.tokenizer, self.device = model.to(device), tokenizer, device
        self.prefix, self.max_length = settings.prefix, settings.max_length
        apply_settings(model, settings.max_new_tokens, settings.num_beams)
        self.collate = Collator(tokenizer.pad_token_id, decoder_start_token(model.config))

    def prepare(self, inputs: list[str]) -> list[list[int]]:
        return encode_sources(self.tokenizer, inputs, self.prefix, self.max_length)

    def length(self, item: list[int]) -> int:
        return len(item)

    def predict(self, batch: list[list[int]]) -> list[dict[str, Any]]:
        # The training collator pads the sources; its one-token targets are placeholders, never read.
        encoded = self.collate([(torch.tensor(ids), torch.tensor([0])) for ids in batch])
        encoded = to_device(encoded, self.device)
        texts = generate_texts(self.model, self.tokenizer, encoded["input_ids"], encoded["attention_mask"])
        return [{"target": text} for text in texts]


def load(model_dir: Path, options: argparse.Namespace, device: torch.device) -> Writer:
    model = load_fine_tuned(AutoModelForSeq2SeqLM, model_dir, "sequence-to-sequence model")
    # The folder's own config.json (final/, or final/adapter/ beside the base model's weights).
    saved = (
        Settings.of(AutoConfig.from_pretrained(model_dir)) if (model_dir / "config.json").is_file() else None
    )
    if saved is None:
        raise PredictError(
            f"{model_dir}: its config.json does not say how training prepared the sources (no "
            f"{SOURCE_LENGTH_KEY}); pass the final/ folder of this project's training run"
        )
    settings = replace(
        saved,
        max_new_tokens=options.max_new_tokens or saved.max_new_tokens,
        num_beams=options.num_beams or saved.num_beams,
    )
    tokenizer = with_pad_token(load_preprocessor(AutoTokenizer, model_dir))
    return Writer(model, tokenizer, device, settings)


PREDICTION = Prediction(read_inputs=read_inputs, load=load, add_arguments=add_arguments)
