"""Generated targets: evaluation scores them and predict writes them, through the same two functions.

The settings (``eval.max_new_tokens``, ``eval.num_beams``) live in the model's ``generation_config``, set
when the model is built and saved with it in ``final/``, so predict's defaults generate exactly what
evaluation did. So do ``data.source_prefix`` and the source length limit, saved in the model's config.

Under FSDP2 every forward gathers parameters with the other ranks, so every rank must run as many: with
``synced_gpus`` a rank whose sequences have all ended keeps running forwards until every rank's have
(transformers' own scheme for sharded models), and the evaluation loop gives every rank as many batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

# Asked of the tokenizer: ids only (no attention mask or token type ids, which the collator makes).
IDS_ONLY = {"return_attention_mask": False, "return_token_type_ids": False}
# The model attribute that tells evaluation whether, and with which tokenizer, to generate.
GENERATION = "seq2seq_generation"
# Attributes of the model's config (config.json, in final/ and final/adapter/ alike) that predict reads
# back: what training did to each source, and evaluation's generation settings.
PREFIX_KEY, SOURCE_LENGTH_KEY = "source_prefix", "max_source_length"
NEW_TOKENS_KEY, BEAMS_KEY = "eval_max_new_tokens", "eval_num_beams"
KEYS = (PREFIX_KEY, SOURCE_LENGTH_KEY, NEW_TOKENS_KEY, BEAMS_KEY)  # in the order of Settings' fields


@dataclass(frozen=True)
class EvalGeneration:
    """What ``evaluation_sums`` needs beside the model: plain values, so copies of the model stay cheap."""

    tokenizer: str
    """Where the run's tokenizer loads from (``model.pretrained``)."""
    metrics: bool
    """eval.generation_metrics: generate and score the validation targets."""


def encode_sources(tokenizer: Any, texts: list[str], prefix: str, max_length: int) -> list[list[int]]:
    """Token ids of each source, the prefix first, cut to ``max_length``: as training, evaluation and
    predict see them."""
    encoded = tokenizer([prefix + text for text in texts], truncation=True, max_length=max_length, **IDS_ONLY)
    return encoded["input_ids"]


@dataclass(frozen=True)
class Settings:
    """How training prepared each source and how evaluation generated: what predict does by default."""

    prefix: str
    max_length: int
    max_new_tokens: int
    num_beams: int

    @classmethod
    def of(cls, config: Any) -> Settings | None:
        """The settings a model config records (None: not a config this project's training saved)."""
        values: list[Any] = [getattr(config, key, None) for key in KEYS]
        return None if None in values else cls(*values)


def configure(model: Any, settings: Settings) -> None:
    """Record the settings in the model's config (saved in final/ and final/adapter/) and apply them."""
    for key, value in zip(KEYS, vars(settings).values(), strict=True):
        setattr(model.config, key, value)
    apply_settings(model, settings.max_new_tokens, settings.num_beams)


def apply_settings(model: Any, max_new_tokens: int, num_beams: int) -> None:
    """Generation settings into the model's generation_config, the rest of which comes with the
    checkpoint: what evaluation generates with, and predict by default."""
    generation_config = model.generation_config
    generation_config.max_new_tokens = max_new_tokens
    generation_config.max_length = None  # max_new_tokens alone bounds the length
    generation_config.num_beams = num_beams


def generate_ids(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The generated ids of a batch of sources, with the model's saved generation settings."""
    sharded = isinstance(model, FSDPModule)
    if not sharded:
        return model.generate(input_ids=input_ids, attention_mask=attention_mask)
    # generate() calls the encoder directly, outside the root module's forward, which is what gathers the
    # root's own parameters (the embeddings the encoder and decoder share): gather them around it, and
    # shard them again after, as the checkpoints and the next step expect them.
    model.unshard()
    try:
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, synced_gpus=True)
    finally:
        model.reshard()


def generate_texts(
    model: Any, tokenizer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[str]:
    """The generated targets of a batch of sources, as text (special tokens dropped, ends stripped)."""
    ids = generate_ids(model, input_ids, attention_mask)
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
