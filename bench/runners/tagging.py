"""Token classification for the hand-written runners: words tokenized with ``is_split_into_words``, each
word's tag on its first sub-word (the others -100), as the generated project and transformers' run_ner.py
label them; evaluation by seqeval's entities, as a user of these loops would count them, summed per rank
and all-reduced (the loss per labelled token, word accuracy, entity-level micro F1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities
from torch import nn
from transformers import AutoModelForTokenClassification

SUMS = ("loss", "correct", "words", "true_positives", "predicted", "true")


def tag_names(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({tag for row in rows for tag in row["tags"]})


def encode(tokenizer: Any, rows: list[dict[str, Any]], names: list[str], length: int) -> tuple[list, list]:
    """Token ids and per-token labels of tagged sentences."""
    index = {name: i for i, name in enumerate(names)}
    encoded = tokenizer(
        [row["tokens"] for row in rows], is_split_into_words=True, truncation=True, max_length=length
    )
    labels = []
    for row_number, row in enumerate(rows):
        seen: set[int] = set()
        row_labels = []
        for word in encoded.word_ids(row_number):
            first = word is not None and word not in seen
            row_labels.append(index[row["tags"][word]] if first else -100)
            seen.add(word)
        labels.append(row_labels)
    return encoded["input_ids"], labels


def build_model(pretrained: str, num_labels: int) -> nn.Module:
    return AutoModelForTokenClassification.from_pretrained(
        pretrained, num_labels=num_labels, ignore_mismatched_sizes=True, dtype=torch.float32
    )


def training_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def entity_counts(truth: list[str], predicted: list[str]) -> tuple[int, int, int]:
    true, guessed = set(get_entities(truth)), set(get_entities(predicted))
    return len(true & guessed), len(guessed), len(true)


@torch.no_grad()
def local_sums(model: nn.Module, loader: Any, names: list[str], autocast: Any) -> torch.Tensor:
    """The SUMS over this rank's evaluation batches; leaves the model in eval mode."""
    model.eval()
    sums = torch.zeros(len(SUMS), dtype=torch.float64)
    for batch in loader:
        with autocast:
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits.float()
        labels = batch["labels"]
        labelled = labels != -100
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        predicted = logits.argmax(dim=-1)
        counts = [0, 0, 0]
        for row in range(len(labels)):
            truth = [names[tag] for tag in labels[row][labelled[row]].tolist()]
            guess = [names[tag] for tag in predicted[row][labelled[row]].tolist()]
            counts = [a + b for a, b in zip(counts, entity_counts(truth, guess), strict=True)]
        correct = ((predicted == labels) & labelled).sum().item()
        sums += torch.tensor([loss.item(), correct, labelled.sum().item(), *counts], dtype=torch.float64)
    return sums


def metrics(sums: list[float]) -> dict[str, float]:
    loss, correct, words, hits, predicted, true = sums
    precision = hits / predicted if predicted else 0.0
    recall = hits / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "eval_loss": loss / words,
        "eval_accuracy": correct / words,
        "eval_precision": precision,
        "eval_recall": recall,
        "eval_f1": f1,
    }


def trainer_metrics(names: list[str]) -> Any:
    """``compute_metrics`` of the Trainer, as transformers' run_ner.py writes it (seqeval)."""

    def compute(prediction: Any) -> dict[str, float]:
        predicted = np.argmax(prediction.predictions, axis=-1)
        truth, guess = [], []
        for labels, row in zip(prediction.label_ids, predicted, strict=True):
            keep = labels != -100
            truth.append([names[tag] for tag in labels[keep]])
            guess.append([names[tag] for tag in row[keep]])
        accuracy = float((predicted == prediction.label_ids)[prediction.label_ids != -100].mean())
        return {
            "precision": precision_score(truth, guess),
            "recall": recall_score(truth, guess),
            "f1": f1_score(truth, guess),
            "accuracy": accuracy,
        }

    return compute
