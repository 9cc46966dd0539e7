"""``python -m <package>.predict``: continue the texts of a JSON Lines file (``text``, the prompt) with a
fine-tuned causal language model. Each record: ``completion``, the generated text after the prompt;
greedy by default, sampled with ``--temperature`` > 0. ``PREDICTION`` at the end hands it to the shared
command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ..cli import whole_number
from ..data import DataError, iter_jsonl
from ..hf import load_fine_tuned, load_preprocessor
from ..task_spec import PredictError, Prediction


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-new-tokens",
        type=whole_number(1),
        default=64,
        metavar="N",
        help="tokens to generate (default: 64)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 (default): greedy; above 0: sampled"
    )
    parser.add_argument("--seed", type=int, default=0, help="of the sampling (default: 0)")


def read_inputs(path: Path) -> list[str]:
    prompts = []
    for row in iter_jsonl(path, ("text",)):
        if not isinstance(row["text"], str):
            raise DataError(f"{path}:{row['_line']}: field 'text' must be a string")
        prompts.append(row["text"])
    return prompts


def context_length(model: Any) -> int:
    limits = [
        getattr(model.config, name, None) for name in ("max_position_embeddings", "n_positions", "n_ctx")
    ]
    return min(limit for limit in limits if isinstance(limit, int))


class Generator:
    """Batches of prompts, left-padded so that every prompt ends where generation starts."""

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, options: argparse.Namespace) -> None:
        self.model, self.tokenizer, self.device = model.to(device), tokenizer, device
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        sampled = options.temperature > 0
        self.generation = GenerationConfig(  # the whole configuration: none of the model's saved defaults
            max_new_tokens=options.max_new_tokens,
            do_sample=sampled,
            temperature=options.temperature if sampled else None,
            top_k=None,
            top_p=None,
            pad_token_id=self.pad,
            eos_token_id=tokenizer.eos_token_id,
        )
        self.prompt_room = context_length(model) - options.max_new_tokens
        if self.prompt_room < 1:
            raise PredictError(
                f"--max-new-tokens {options.max_new_tokens} leaves no room for a prompt in the model's "
                f"context of {context_length(model)} tokens; lower it"
            )
        torch.manual_seed(options.seed)

    def prepare(self, inputs: list[str]) -> list[list[int]]:
        """Token ids of each prompt: its last tokens where it is longer than the context leaves room for;
        an empty prompt starts a document (the end-of-text token, which separates documents in training)."""
        encoded = self.tokenizer(inputs, add_special_tokens=False)["input_ids"]
        return [ids[-self.prompt_room :] if ids else [self.tokenizer.eos_token_id] for ids in encoded]

    def length(self, item: list[int]) -> int:
        return len(item)

    def predict(self, batch: list[list[int]]) -> list[dict[str, Any]]:
        longest = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), longest), self.pad, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, longest - len(ids) :] = torch.tensor(ids)
            attention_mask[row, longest - len(ids) :] = 1
        output = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            generation_config=self.generation,
        )
        new_tokens = output[:, longest:].tolist()
        return [{"completion": self.tokenizer.decode(ids, skip_special_tokens=True)} for ids in new_tokens]


def load(model_dir: Path, options: argparse.Namespace, device: torch.device) -> Generator:
    model = load_fine_tuned(AutoModelForCausalLM, model_dir, "causal language model")
    tokenizer = load_preprocessor(AutoTokenizer, model_dir)
    if tokenizer.eos_token_id is None:
        raise PredictError(f"{model_dir}: its tokenizer has no end-of-text token; pass a causal LM's final/")
    return Generator(model, tokenizer, device, options)


PREDICTION = Prediction(read_inputs=read_inputs, load=load, add_arguments=add_arguments)
