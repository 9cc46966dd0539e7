"""Loss, evaluation sums and metrics of a token classifier, counted per word (on its first token).

Every figure is a sum over sentences (loss, words, correct words, and the entity counts: true positives,
predicted and true entities), so the evaluation loop adds them up over batches and ranks and the metrics
equal ``seqeval`` run once over the whole validation set, for any world size (tests prove it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..task.spec import Batch, at_least_fp32
from .alignment import IGNORE, UNSEEN
from .entities import COUNT_NAMES, OUTSIDE, entity_counts, entity_scores

SUM_NAMES = ("loss", "seen_words", "correct_words", "words", *COUNT_NAMES)


def logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The summed cross-entropy over the words the model sees, in fp32 whatever the autocast dtype."""
    scores = at_least_fp32(logits(model, batch))
    return F.cross_entropy(
        scores.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE, reduction="sum"
    )


def tag_names(model: nn.Module) -> list[str]:
    """The model's tags by id, from its config (a LoRA wrapper forwards ``config`` to the model)."""
    id2label: dict[Any, str] = model.config.id2label  # type: ignore[union-attr,assignment]
    return [id2label[index] for index in range(len(id2label))]


def word_predictions(scores: torch.Tensor, batch: Batch, outside: int) -> torch.Tensor:
    """Each word's predicted tag id, from the scores of its first token; ``outside`` for unseen words."""
    starts = batch["word_starts"]
    predicted = scores.argmax(dim=-1).gather(1, starts.clamp(min=0))
    return torch.where(starts >= 0, predicted, torch.full_like(predicted, outside))


def sentence_tags(tag_rows: list[list[int]], names: list[str]) -> list[list[str]]:
    """Tag names per sentence, the padding (``UNSEEN``) dropped; an id past the names is ``O``."""
    return [[names[tag] if tag < len(names) else OUTSIDE for tag in row if tag != UNSEEN] for row in tag_rows]


def evaluation_sums(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    names = tag_names(model)
    # A tagger says O for the words it does not see; a tag set without O gets an id that is no tag.
    outside = names.index(OUTSIDE) if OUTSIDE in names else len(names)
    scores = at_least_fp32(logits(model, batch))
    labels, truth = batch["labels"], batch["word_tags"]
    predicted = word_predictions(scores, batch, outside)
    is_word = truth != UNSEEN
    loss = F.cross_entropy(scores.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
    # Entities are read on the host, sentence by sentence (one copy of two small id tables a batch).
    true_tags = sentence_tags(truth.tolist(), names)
    predicted_tags = sentence_tags(torch.where(is_word, predicted, UNSEEN).tolist(), names)
    counts = [sum(column) for column in zip(*map(entity_counts, true_tags, predicted_tags), strict=True)]

    def total(value: float | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float64, device=labels.device)

    return {
        "loss": loss.double(),
        "seen_words": total((labels != IGNORE).sum()),
        "correct_words": total(((predicted == truth) & is_word).sum()),
        "words": total(is_word.sum()),
        **{name: total(float(count)) for name, count in zip(COUNT_NAMES, counts, strict=True)},
    }


def evaluation_metrics(sums: dict[str, float]) -> dict[str, float]:
    seen = sums["seen_words"]
    return {
        "eval_loss": sums["loss"] / seen if seen else math.nan,
        "eval_accuracy": sums["correct_words"] / sums["words"],
        **entity_scores(sums["true_positives"], sums["predicted_entities"], sums["true_entities"]),
    }
