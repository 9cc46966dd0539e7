"""``python -m <package>.predict``: answer the prompts of a JSON Lines file with a fine-tuned causal language
model, each line in a training format: ``{"text"}`` (continued), ``{"prompt"}`` (the completion data's
prompt) or ``{"messages"}`` (a conversation, answered as the assistant through the chat template saved in
the model folder). Each record: ``completion``, the generated text after the prompt;
greedy by default, sampled with ``--temperature`` > 0. ``PREDICTION`` at the end hands it to the shared
command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ..config.cli import whole_number
from ..data.loader import DataError, iter_jsonl
from ..task.hugging_face import load_fine_tuned, load_preprocessor
from ..task.spec import PredictError, Prediction
from .instructions import message_problem

Prompt = tuple[str, Any]  # the record's format (text, prompt, messages) and its value


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


def read_inputs(path: Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    for row in iter_jsonl(path, ()):
        kind = next((name for name in ("messages", "prompt", "text") if name in row), None)
        if kind is None:
            raise DataError(f"{path}:{row['_line']}: missing field 'text' (or 'prompt', or 'messages')")
        problem = message_problem(row[kind]) if kind == "messages" else None
        if kind != "messages" and not isinstance(row[kind], str):
            problem = f"field {kind!r} must be a string"
        if problem:
            raise DataError(f"{path}:{row['_line']}: {problem}")
        prompts.append((kind, row[kind]))
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

    def prepare(self, inputs: list[Prompt]) -> list[list[int]]:
        """Token ids of each prompt, as training made them: its last tokens where it is longer than the
        context leaves room for; an empty text starts a document (the end-of-text token, which separates
        documents in training)."""
        return [self.encode(kind, value)[-self.prompt_room :] for kind, value in inputs]

    def encode(self, kind: str, value: Any) -> list[int]:
        if kind == "messages":
            if self.tokenizer.chat_template is None:
                raise PredictError(
                    'the model\'s tokenizer has no chat template for {"messages"} prompts; train with '
                    'data.chat_template, or give {"prompt"} lines'
                )
            value = self.tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(value, add_special_tokens=kind == "prompt")["input_ids"]
        return ids or [self.tokenizer.eos_token_id]

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
