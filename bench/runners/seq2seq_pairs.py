"""Sequence to sequence for the hand-written runners, as the generated project does it: sources cut to
``max_length``, targets ending with the end-of-text token, the decoder reading the target shifted right
behind the model's start token, and the cross-entropy of every target token."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

TARGET_LENGTH = 128  # the project's data.max_target_length default


class PairDataset(Dataset):
    def __init__(self, sources: list[list[int]], targets: list[list[int]]) -> None:
        self.sources, self.targets = sources, targets

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.sources[index], "labels": self.targets[index]}


def load(spec: dict[str, Any], rows_of: Any) -> tuple[Any, Dataset, Dataset, int]:
    """(tokenizer, train, val, 0) of the spec's JSON Lines pairs."""
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    length = min(spec["max_length"], tokenizer.model_max_length)
    splits = []
    for key in ("train_file", "val_file"):
        rows = rows_of(spec[key])
        sources = tokenizer([row["source"] for row in rows], truncation=True, max_length=length)["input_ids"]
        targets = tokenizer(
            text_target=[row["target"] for row in rows], truncation=True, max_length=TARGET_LENGTH
        )
        splits.append(PairDataset(sources, targets["input_ids"]))
    return tokenizer, splits[0], splits[1], 0


class PadPairs:
    """Sources padded with the pad token, targets with -100, and the decoder's shifted input."""

    def __init__(self, spec: dict[str, Any], pad_id: int) -> None:
        self.pad_id, self.start = pad_id, AutoConfig.from_pretrained(spec["model"]).decoder_start_token_id

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = torch.full((len(samples), max(len(s["input_ids"]) for s in samples)), self.pad_id)
        labels = torch.full((len(samples), max(len(s["labels"]) for s in samples)), -100)
        mask = torch.zeros_like(ids)
        for row, sample in enumerate(samples):
            ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
            mask[row, : len(sample["input_ids"])] = 1
            labels[row, : len(sample["labels"])] = torch.tensor(sample["labels"])
        decoder_ids = torch.cat([torch.full_like(labels[:, :1], self.start), labels[:, :-1]], dim=1)
        decoder_ids[decoder_ids == -100] = self.pad_id
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_ids, "labels": labels}


def token_losses(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's summed target-token loss, and its number of target tokens."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    ).logits.float()
    labels = batch["labels"]
    losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none").sum(dim=1)
    return losses, (labels != -100).sum(dim=1)


def build_model(spec: dict[str, Any]) -> nn.Module:
    return AutoModelForSeq2SeqLM.from_pretrained(spec["model"], dtype=torch.float32)


def mean_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training loss: the mean over this rank's target tokens."""
    losses, counts = token_losses(model, batch)
    return losses.sum() / counts.sum()


def evaluation_rows(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[loss sum, 0, target tokens] of each sample, in float64, as common.evaluation_rows gives."""
    losses, counts = token_losses(model, batch)
    return torch.stack([losses.double(), torch.zeros_like(losses, dtype=torch.float64), counts.double()], 1)
