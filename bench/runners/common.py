"""What every hand-written runner shares, so they do the same work as the generated project: the data
(same files, tokenizer, truncation and packing), the model, AdamW groups, the warmup/decay schedule,
the loss and exact evaluation sums; the timeline each run reports to the bench is timeline.py's.

A runner is started by torchrun with one argument: the path of a JSON spec written by the bench.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import seq2seq_pairs
import tagging
import torch
import torch.distributed as dist
import torch.nn.functional as F
from timeline import Timeline as Timeline  # the runners' common.Timeline
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as transformers_logging


def load_spec() -> dict[str, Any]:
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    return json.loads(Path(sys.argv[1]).read_text())


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


class TextDataset(Dataset):
    def __init__(self, ids: list[list[int]], labels: list[int]) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


class BlockDataset(Dataset):
    """Blocks of ``size`` tokens overlapping by one, as the generated project cuts them."""

    def __init__(self, stream: torch.Tensor, size: int, keep_partial: bool) -> None:
        self.stream, self.size, self.stride = stream, size, size - 1
        if keep_partial:
            self.count = math.ceil((len(stream) - 1) / self.stride)
        else:
            self.count = (len(stream) - size) // self.stride + 1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        block = self.stream[index * self.stride : index * self.stride + self.size].tolist()
        return {"input_ids": block, "labels": block}


def load_data(spec: dict[str, Any]) -> tuple[Any, Dataset, Dataset, int]:
    """(tokenizer, train, val, number of labels) of the spec's task."""
    if spec["task"] == "seq2seq":
        return seq2seq_pairs.load(spec, read_jsonl)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    length = min(spec["max_length"], tokenizer.model_max_length)
    if spec.get("instructions"):
        return (
            tokenizer,
            *(instruction_samples(tokenizer, spec[key], length) for key in ("train_file", "val_file")),
            0,
        )
    if spec["task"] == "causal-lm":
        splits = []
        for path, keep_partial in ((spec["train_file"], False), (spec["val_file"], True)):
            texts = [row["text"] for row in read_jsonl(path)]
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            stream = list(itertools.chain.from_iterable((*doc, tokenizer.eos_token_id) for doc in ids))
            splits.append(BlockDataset(torch.tensor(stream), length, keep_partial))
        return tokenizer, splits[0], splits[1], 0
    train_rows, val_rows = read_jsonl(spec["train_file"]), read_jsonl(spec["val_file"])
    if spec["task"] == "token-classification":  # each word's tag on its first token
        tags = tagging.tag_names(train_rows)
        train, val = (
            TextDataset(*tagging.encode(tokenizer, rows, tags, length)) for rows in (train_rows, val_rows)
        )
        return tokenizer, train, val, len(tags)
    names = sorted({row["label"] for row in train_rows})
    index = {name: i for i, name in enumerate(names)}

    def encode(rows: list[dict[str, Any]]) -> TextDataset:
        ids = tokenizer([row["text"] for row in rows], truncation=True, max_length=length)["input_ids"]
        return TextDataset(ids, [index[row["label"]] for row in rows])

    return tokenizer, encode(train_rows), encode(val_rows), len(names)


def instruction_samples(tokenizer: Any, path: str, length: int) -> TextDataset:
    """Prompt/completion pairs as the project encodes them: the prompt (with the tokenizer's special
    tokens), then the completion and the end-of-text token, which alone are labelled."""
    rows = read_jsonl(path)
    prompts = tokenizer([row["prompt"] for row in rows])["input_ids"]
    answers = tokenizer([row["completion"] for row in rows], add_special_tokens=False)["input_ids"]
    ids, labels = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        completion = [*answer, tokenizer.eos_token_id]
        assert len(prompt) + len(completion) <= length, "the bench's pairs fit the window: none is cut"
        ids.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    return TextDataset(ids, labels)  # type: ignore[arg-type]


class PadToLongest:
    """Dynamic padding: each batch padded to its own longest sample."""

    def __init__(self, pad_id: int, causal: bool) -> None:
        self.pad_id, self.causal = pad_id, causal

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(sample["input_ids"]) for sample in samples)
        ids = torch.full((len(samples), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(samples), longest), dtype=torch.long)
        labels = torch.full((len(samples), longest), -100, dtype=torch.long) if self.causal else None
        for row, sample in enumerate(samples):
            n = len(sample["input_ids"])
            ids[row, :n] = torch.tensor(sample["input_ids"])
            mask[row, :n] = 1
            if labels is not None:
                labels[row, :n] = torch.tensor(sample["labels"])
        if labels is None:
            labels = torch.tensor([sample["labels"] for sample in samples])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def collator(spec: dict[str, Any], tokenizer: Any) -> Any:
    if spec["task"] == "seq2seq":
        return seq2seq_pairs.PadPairs(spec, tokenizer.pad_token_id)
    return PadToLongest(tokenizer.pad_token_id, spec["task"] != "text-classification")


def build_model(spec: dict[str, Any], num_labels: int) -> nn.Module:
    if spec["task"] == "seq2seq":
        return seq2seq_pairs.build_model(spec)
    if spec["task"] == "causal-lm":
        model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
        return with_lora(model, spec["lora"]) if spec.get("lora") else model
    if spec["task"] == "token-classification":
        return tagging.build_model(spec["model"], num_labels)
    return AutoModelForSequenceClassification.from_pretrained(
        spec["model"], num_labels=num_labels, ignore_mismatched_sizes=True, dtype=torch.float32
    )


def with_lora(model: nn.Module, settings: dict[str, Any]) -> nn.Module:
    """peft's LoRA adapters on a causal LM, as its documentation applies them."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=settings["r"],
        lora_alpha=settings["alpha"],
        lora_dropout=settings["dropout"],
        target_modules=settings["target_modules"],
    )
    return get_peft_model(model, config)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def warmup_then_linear_decay(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = round(warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast(spec: dict[str, Any]):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["precision"] == "bf16")


def training_loss(model: nn.Module, batch: dict[str, torch.Tensor], task: str) -> torch.Tensor:
    if task == "seq2seq":
        return seq2seq_pairs.mean_loss(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if task == "causal-lm":
        targets = batch["labels"][:, 1:]
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=-100)
    if task == "token-classification":
        return tagging.training_loss(logits, batch["labels"])
    return F.cross_entropy(logits, batch["labels"])


@torch.no_grad()
def evaluation_rows(model: nn.Module, batch: dict[str, torch.Tensor], task: str) -> torch.Tensor:
    """[loss sum, correct, count] of each sample, in float64: they add up exactly across ranks."""
    if task == "seq2seq":
        return seq2seq_pairs.evaluation_rows(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if task == "causal-lm":
        targets = batch["labels"][:, 1:]
        losses = F.cross_entropy(
            logits[:, :-1].transpose(1, 2), targets, ignore_index=-100, reduction="none"
        ).sum(dim=1)
        counts = (targets != -100).sum(dim=1)
        return torch.stack(
            [losses.double(), torch.zeros_like(losses, dtype=torch.float64), counts.double()], 1
        )
    labels = batch["labels"]
    losses = F.cross_entropy(logits, labels, reduction="none")
    correct = logits.argmax(dim=-1) == labels
    return torch.stack([losses.double(), correct.double(), torch.ones_like(losses, dtype=torch.float64)], 1)


def local_sums(model: nn.Module, loader: Any, spec: dict[str, Any]) -> torch.Tensor:
    """[loss sum, correct, count] over this rank's evaluation batches; leaves the model in eval mode."""
    if spec["task"] == "token-classification":
        return tagging.local_sums(
            model, loader, tagging.tag_names(read_jsonl(spec["train_file"])), autocast(spec)
        )
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    for batch in loader:
        with autocast(spec):
            sums += evaluation_rows(model, batch, spec["task"]).sum(dim=0)
    return sums


def optimizer_step(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def metrics_from_sums(sums: list[float], task: str) -> dict[str, float]:
    if task == "token-classification":
        return tagging.metrics(sums)
    loss = sums[0] / sums[2]
    if task in ("causal-lm", "seq2seq"):
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0))}
    return {"eval_loss": loss, "eval_accuracy": sums[1] / sums[2]}


def eval_shard(size: int, rank: int, world_size: int) -> list[int]:
    """Every validation sample on exactly one rank, no padding duplicates."""
    return list(range(rank, size, world_size))


def finish() -> None:
    """Destroy the process group once nothing refers to the DDP wrapper any more: the other order can
    abort a rank at exit ("terminate called without an active exception")."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
