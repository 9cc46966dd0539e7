"""Words to sub-word tokens and back: the tokenized form of a tagged sentence, and its batches.

A word may become several tokens; its tag goes on the first of them, and the others get the ignore index
(-100), so the loss and the metrics count every word once, whatever its number of pieces. A word the model
does not see (past ``data.max_length`` tokens, or one the tokenizer makes no token of) keeps its true
tag for the metrics and counts as tagged ``O``, as a tagger that stopped early would have tagged it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..task.spec import Batch

IGNORE = -100  # the label of a sub-word that is not a word's first: cross_entropy's ignore_index
UNSEEN = -1  # the start of a word the model does not see; also the padding of word rows in a batch
IDS_ONLY = {"return_attention_mask": False, "return_token_type_ids": False}


def word_starts(word_ids: Sequence[int | None], words: int) -> list[int]:
    """Each word's first token position (``UNSEEN`` where it has none), from a tokenizer's word_ids."""
    starts = [UNSEEN] * words
    for position, word in enumerate(word_ids):
        if word is not None and starts[word] == UNSEEN:
            starts[word] = position
    return starts


class Tokenize:
    """The batched ``map`` function: token ids (truncated), word starts and tag ids of tagged sentences."""

    def __init__(self, tokenizer: Any, length: int, tag_ids: dict[str, int]) -> None:
        self.tokenizer, self.length, self.tag_ids = tokenizer, length, tag_ids

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        sentences = batch["tokens"]
        encoded = self.tokenizer(
            sentences, is_split_into_words=True, truncation=True, max_length=self.length, **IDS_ONLY
        )
        starts = [word_starts(encoded.word_ids(row), len(words)) for row, words in enumerate(sentences)]
        tags = [[self.tag_ids[tag] for tag in row] for row in batch["tags"]]
        return {"input_ids": encoded["input_ids"], "word_starts": starts, "word_tags": tags}


Sample = tuple[Sequence[int], Sequence[int], Sequence[int]]  # token ids, word starts, word tag ids


class Collator:
    """Pads each batch to its own longest sample (dynamic padding); ``labels`` holds each word's tag on its
    first token, ``word_starts`` and ``word_tags`` every word of the sentence (padded with ``UNSEEN``)."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, samples: list[Sample]) -> Batch:
        longest = max(len(ids) for ids, _, _ in samples)
        most_words = max(len(tags) for _, _, tags in samples)
        rows = len(samples)
        input_ids = torch.full((rows, longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, longest), dtype=torch.long)
        labels = torch.full((rows, longest), IGNORE, dtype=torch.long)
        starts = torch.full((rows, most_words), UNSEEN, dtype=torch.long)
        tags = torch.full((rows, most_words), UNSEEN, dtype=torch.long)
        for row, (ids, word_start, word_tag) in enumerate(samples):
            input_ids[row, : len(ids)] = torch.as_tensor(ids)
            attention_mask[row, : len(ids)] = 1
            starts[row, : len(word_start)] = torch.as_tensor(word_start)
            tags[row, : len(word_tag)] = torch.as_tensor(word_tag)
            seen = starts[row] >= 0
            labels[row, starts[row, seen]] = tags[row, seen]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "word_starts": starts,
            "word_tags": tags,
        }


def count_words(batch: Batch) -> int:
    """The words ``loss_sum`` adds up: those the model sees (their first tokens carry a label)."""
    return int((batch["labels"] != IGNORE).sum())
