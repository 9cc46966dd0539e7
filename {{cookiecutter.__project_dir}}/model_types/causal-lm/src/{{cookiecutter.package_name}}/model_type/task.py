"""Causal language modelling: documents of text, or instruction samples, fine-tuning an AutoModelForCausalLM.

The data is JSON Lines, JSON, CSV or Parquet (``data.train_file``, ``data.val_file``), or the splits of a
hub dataset or local dataset folder (``data.hub_dataset``), read with Hugging Face ``datasets``. A file of
``{"prompt", "completion"}`` or ``{"messages"}`` records holds instruction samples (instructions.py); a
file of documents has them in the column ``data.text_field``. Documents are tokenized, joined with the
end-of-text token into one stream and cut into blocks of ``data.max_length`` tokens, capped by the model's
context (packing.py). Consecutive blocks overlap by one token, so every token after the first is a
prediction target exactly once. Training uses full blocks only, so every rank's batch holds the same
number of tokens; validation keeps the shorter last block, so evaluation scores every validation token
exactly once across ranks.

Preprocessing runs once per filesystem (see data/cache.py): tokenizing and packing are each a batched
``map`` in as many processes as there are cores, into Arrow files under ``output_dir/cache`` that every
rank memory-maps; a rerun with the same data, tokenizer and settings reads them back.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..config import Config, ConfigError
from ..config.data import PaddingFree
from ..data.cache import prepare
from ..data.sources import (
    SplitReader,
    quiet_datasets,
)
from ..observe.log import log
from ..parallel.ddp import unwrap
from ..parallel.process_group import DistEnv
from ..task.hugging_face import quiet_transformers, save_pretrained
from ..task.spec import Batch, Task, TaskData, at_least_fp32, count_real_tokens
from .generation import generate
from .instructions import IGNORE_INDEX, SampleDataset
from .packing import BlockDataset
from .padding_free import (
    SAMPLES_APART,
    attends_within_samples,
    model_inputs,
    the_form_for,
    with_packed_row,
    worth_trying,
)
from .recipe import PackRecipe


def load_tokenizer(config: Config) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(config.model.pretrained)
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"model.pretrained={config.model.pretrained!r}: the tokenizer has no end-of-text token "
            "to separate documents; use a causal language model's tokenizer"
        )
    if tokenizer.pad_token is None:  # GPT-2/Llama-style tokenizers have none; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    quiet_datasets()
    tokenizer = load_tokenizer(config)
    if config.data.chat_template:  # saved with the tokenizer in final/, for predict and generation
        tokenizer.chat_template = Path(config.data.chat_template).read_text(encoding="utf-8")
    root = Path(config.output_dir) / "cache"
    with SplitReader(root) as reader:
        prepared = prepare(PackRecipe(config, tokenizer, reader), root, env)
    train, val = (as_dataset(prepared.splits.get(split)) for split in ("train", "val"))
    assert train is not None
    shape = "samples of up to" if isinstance(train, SampleDataset) else "blocks of"
    for warning in prepared.meta.get("warnings", []):
        log.warning(warning)
    log.info(f"training on {shape} {prepared.meta['block_size']} tokens")
    return TaskData(
        train=train,
        val=val,
        collate=Collator(
            tokenizer.pad_token_id,
            padding_free=config.data.padding_free is not PaddingFree.never,
            multiple=PAD_TO_MULTIPLE,
            limit=prepared.meta["block_size"],
        ),
        label_names=[],
        preprocessor=tokenizer,
        count_tokens=count_real_tokens,
        train_lengths=lengths(train),
        val_lengths=lengths(val),
        group_by_length=config.data.group_by_length,
    )


def as_dataset(rows: datasets.Dataset | None) -> SampleDataset | BlockDataset | None:
    """Instruction samples carry their labels; packed blocks are their own labels."""
    if rows is None:
        return None
    return SampleDataset(rows) if "labels" in rows.column_names else BlockDataset(rows)


def lengths(dataset: Dataset | None) -> torch.Tensor | None:
    """Sample lengths, for length grouping; None for blocks, which all have one length."""
    return torch.from_numpy(dataset.lengths()) if isinstance(dataset, SampleDataset) else None


# Padded batches are as wide as their longest sample rounded up to this multiple (at most the block size).
# Every new batch shape costs memory for good: on CPU, bf16 matmuls keep oneDNN primitives and ideep's
# cached kernels per shape (about 10-17 MiB per shape for a small LoRA model), so length-grouped batches
# of every width from 24 to 61 tokens grew each rank by ~570 MiB over an epoch; multiples of 8 keep 6 of
# those widths, and suit GPU tensor cores too. Padding carries no loss and no attention.
PAD_TO_MULTIPLE = 8


class Collator:
    """Pads a batch on the right, with no loss on padding: instruction samples of many lengths, or blocks
    (only the shorter last validation block needs padding). A block is its own labels. A batch of
    instruction samples also carries them end to end in one row, for models that train padding-free
    (padding_free.py). The width is the longest sample's, rounded up to ``multiple`` but never past
    ``limit`` (the block size, within the model's context)."""

    def __init__(
        self, pad_token_id: int, padding_free: bool = False, multiple: int = 1, limit: int | None = None
    ) -> None:
        self.pad_token_id, self.padding_free = pad_token_id, padding_free
        self.multiple, self.limit = multiple, limit

    def width(self, longest: int) -> int:
        rounded = -(-longest // self.multiple) * self.multiple
        return rounded if self.limit is None else max(longest, min(rounded, self.limit))

    def __call__(self, items: list[torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
        pairs = [item if isinstance(item, tuple) else (item, item) for item in items]
        longest = self.width(max(len(ids) for ids, _ in pairs))
        input_ids = torch.full((len(pairs), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(pairs), longest), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(pairs), longest), dtype=torch.long)
        for row, (ids, targets) in enumerate(pairs):
            input_ids[row, : len(ids)] = ids
            labels[row, : len(ids)] = targets
            attention_mask[row, : len(ids)] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        return with_packed_row(batch, pairs) if self.padding_free and isinstance(items[0], tuple) else batch


def build_model(config: Config, data: TaskData) -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(
        config.model.pretrained,
        dtype=torch.float32,  # master weights stay fp32; autocast handles bf16/fp16
    )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = data.preprocessor.pad_token_id
    log.info(f"loaded {config.model.pretrained}")
    if isinstance(data.train, SampleDataset):
        if worth_trying(config.data.padding_free, model):
            choose_padding_free(model, data.train)
        elif config.data.padding_free is PaddingFree.auto:
            batches = "grouped by length" if config.data.group_by_length else "in random batches"
            log.info(
                f"instruction samples padded, {batches}: a padding-free row pays with flash attention "
                "only (data.padding_free=always packs with any)"
            )
    return model


def choose_padding_free(model: nn.Module, train: SampleDataset) -> None:
    """Padding-free forwards where the model keeps packed samples apart (checked on two samples)."""
    apart = attends_within_samples(model, [train[i][0] for i in range(min(2, len(train)))])
    setattr(model, SAMPLES_APART, apart)
    if apart:
        log.info("instruction samples padding-free: packed per micro-batch, each attending to itself only")
    else:
        log.info(
            f"instruction samples padded: {type(model).__name__} lets samples packed in one row attend "
            "to each other (padding-free rows need attention masked by position ids)"
        )


def _token_losses(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss of predicting token t+1 from tokens <= t, and the mask of positions that count."""
    # No key/value cache: training attends through the padding mask (or a padding-free batch's position
    # ids) alone, never to cached positions.
    batch = the_form_for(unwrap(model), batch)
    logits = model(**model_inputs(batch), use_cache=False).logits
    targets = batch["labels"][:, 1:]
    losses = F.cross_entropy(
        at_least_fp32(logits[:, :-1].flatten(0, 1)),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return losses, targets.flatten() != IGNORE_INDEX


def loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    return _token_losses(model, batch)[0].sum()


def count_targets(batch: Batch) -> int:
    """Tokens that are prediction targets: every labelled position but each row's first (the same in
    the padding-free row, which labels no sample's first position)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def evaluation_sums(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    losses, counted = _token_losses(model, batch)
    return {"loss": losses.double().sum(), "count": counted.sum().double()}


def evaluation_metrics(sums: dict[str, float]) -> dict[str, float]:
    loss = sums["loss"] / sums["count"]
    return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0))}


def save_final(model: nn.Module, data: TaskData, directory: Path) -> None:
    save_pretrained(model, data.preprocessor, directory)


TASK = Task(
    build_data=build_data,
    build_model=build_model,
    loss_sum=loss_sum,
    count_targets=count_targets,
    evaluation_sums=evaluation_sums,
    sum_names=("loss", "count"),
    evaluation_metrics=evaluation_metrics,
    save_final=save_final,
    generate=generate,
)
