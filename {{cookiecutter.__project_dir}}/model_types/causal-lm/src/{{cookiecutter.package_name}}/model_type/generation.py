"""Greedy completions of validation prompts during training (``eval.generate_samples``, see
loop/generations.py): the prompt of an instruction sample is everything before its first target token and
its reference the response that follows; a block of plain text is cut in half.

Every prompt gets exactly ``max_new_tokens`` forwards, cut at the first end-of-text token afterwards:
ranks never stop at different times, which an FSDP2 forward (a collective) could not survive. Forwards
run without a key/value cache, as training's do.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..task.spec import TaskData, dataset_size
from .instructions import IGNORE_INDEX


def prompt_and_reference(
    item: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
) -> tuple[list[int], list[int]]:
    """The prompt, and the first response after it (an instruction sample's first run of targets)."""
    if not isinstance(item, tuple):  # a block of documents
        middle = max(1, len(item) // 2)
        return item[:middle].tolist(), item[middle:].tolist()
    ids, labels = item
    targets = (labels != IGNORE_INDEX).nonzero().flatten().tolist()  # a kept sample has at least one
    start = max(1, targets[0])  # the first token has nothing before it to predict it from
    end = next((a + 1 for a, b in itertools.pairwise(targets) if b != a + 1), targets[-1] + 1)
    return ids[:start].tolist(), ids[start:end].tolist()


def context_length(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    limits = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions", "n_ctx")]
    known = [limit for limit in limits if isinstance(limit, int)]
    return min(known) if known else None


def greedy(model: nn.Module, prompt: list[int], new_tokens: int, device: torch.device) -> list[int]:
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    for _ in range(new_tokens):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return ids[0, len(prompt) :].tolist()


def generate(
    model: nn.Module, data: TaskData, count: int, max_new_tokens: int, device: torch.device
) -> list[dict[str, Any]]:
    tokenizer = data.preprocessor
    val: Dataset = data.val  # type: ignore[assignment]  # the writer only asks when there is one
    limit = context_length(model)
    records = []
    for index in range(min(count, dataset_size(val))):
        prompt, reference = prompt_and_reference(val[index])
        room = max_new_tokens if limit is None else max(0, min(max_new_tokens, limit - len(prompt)))
        completion = greedy(model, prompt, room, device)
        if tokenizer.eos_token_id in completion:
            completion = completion[: completion.index(tokenizer.eos_token_id)]
        records.append(
            {
                "index": index,
                "prompt": tokenizer.decode(prompt),
                "completion": tokenizer.decode(completion),
                "reference": tokenizer.decode(reference, skip_special_tokens=True),
            }
        )
    return records
