"""Causal language modelling: documents of text, fine-tuning an AutoModelForCausalLM.

The data is JSON Lines, JSON, CSV or Parquet (``data.train_file``, ``data.val_file``), or the splits of a
hub dataset or local dataset folder (``data.hub_dataset``), read with Hugging Face ``datasets``; the text
column is ``data.text_field``. Documents are tokenized, joined with the end-of-text token into one stream
and cut into blocks of ``data.max_length`` tokens, capped by the model's context. Consecutive blocks
overlap by one token, so every token after the first is a prediction target exactly once. Training uses
full blocks only, so every rank's batch holds the same number of tokens; validation keeps the shorter
last block, so evaluation scores every validation token exactly once across ranks.

Preprocessing runs once per filesystem (see data_cache.py): tokenizing and packing are each a batched
``map`` in as many processes as there are cores, into Arrow files under ``output_dir/cache`` that every
rank memory-maps; a rerun with the same data, tokenizer and settings reads them back.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from datasets.fingerprint import Hasher
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ..arrow_rows import IntegerLists, flat_values
from ..config import Config, ConfigError
from ..data import DataError
from ..data_cache import arrow_file, prepare, processes
from ..data_sources import (
    Source,
    SplitReader,
    naming_undecodable,
    quiet_datasets,
    read_text_split,
    split_sources,
)
from ..distributed import DistEnv
from ..hf import quiet_transformers, save_pretrained
from ..log import log
from ..task_spec import Batch, Task, TaskData, at_least_fp32, count_real_tokens

IGNORE_INDEX = -100  # label of padding: no loss
CACHE_FORMAT = 2  # of the packed blocks; part of their key, so an older layout is never read
PACK_BATCH = 1000  # blocks cut per call of the packing map
IDS_ONLY = {"return_attention_mask": False, "return_token_type_ids": False}  # 15% less tokenizer time
TOKENS = datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))})


def block_count(tokens: int, size: int, keep_partial: bool) -> int:
    """Blocks of ``size`` tokens, overlapping by one, in a stream of ``tokens``: block i starts at
    i * (size - 1). With ``keep_partial``, every start that leaves at least one target."""
    stride = size - 1
    if keep_partial:
        return math.ceil((tokens - 1) / stride) if tokens >= 2 else 0
    return (tokens - size) // stride + 1 if tokens >= size else 0


class BlockDataset(Dataset):
    """The blocks of a packed split, memory-mapped: block i as an int32 tensor (batches are int64)."""

    def __init__(self, rows: datasets.Dataset) -> None:
        self.blocks = IntegerLists(rows, "input_ids")

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(self.blocks[index])


class Tokenize:
    """The tokenizing ``map``: each document's token ids, followed by the end-of-text token."""

    def __init__(self, tokenizer: Any, text_field: str) -> None:
        self.tokenizer, self.text_field = tokenizer, text_field

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        texts = batch[self.text_field]
        encoded = self.tokenizer(texts, add_special_tokens=False, **IDS_ONLY)["input_ids"]
        return {"input_ids": [[*ids, self.tokenizer.eos_token_id] for ids in encoded]}


class CutBlocks:
    """The packing ``map``, over block numbers: each block's tokens, read from the documents it spans.

    ``ends[d]`` is where document d ends in the stream of all documents; a batch of consecutive blocks
    reads just the documents under it, so the result equals cutting the whole stream at once.
    """

    def __init__(self, documents: datasets.Dataset, ends: np.ndarray, size: int) -> None:
        self.documents, self.ends, self.size = documents, ends, size

    def __call__(self, batch: dict[str, list[int]]) -> dict[str, list[np.ndarray]]:
        stride, blocks = self.size - 1, batch["block"]
        start, stop = blocks[0] * stride, min(blocks[-1] * stride + self.size, int(self.ends[-1]))
        first = int(np.searchsorted(self.ends, start, side="right"))
        last = int(np.searchsorted(self.ends, stop - 1, side="right"))
        stream = flat_values(self.documents.data.slice(first, last - first + 1).column("input_ids"))
        offset = int(self.ends[first - 1]) if first else 0
        return {"input_ids": [stream[b * stride - offset : b * stride - offset + self.size] for b in blocks]}


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


def block_size(config: Config) -> int:
    """``data.max_length``, capped by the context the model was trained for."""
    model_config = AutoConfig.from_pretrained(config.model.pretrained)
    limits = [
        getattr(model_config, name, None) for name in ("max_position_embeddings", "n_positions", "n_ctx")
    ]
    return min([config.data.max_length, *[limit for limit in limits if isinstance(limit, int)]])


class PackRecipe:
    """How the packed splits are made (data_cache.Recipe): tokenized, then cut, both in parallel."""

    name = "causal-lm"

    def __init__(self, config: Config, tokenizer: Any, reader: SplitReader) -> None:
        data = config.data
        self.train_source, self.val_source = split_sources(data, data.train_file, data.val_file)
        self.tokenizer, self.reader, self.text_field = tokenizer, reader, data.text_field
        self.size, self.processes = block_size(config), data.preprocessing_processes

    def key(self) -> str:
        sources = [self.train_source, self.val_source]
        # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
        data = [s and (s.fingerprint() or self.reader.read(s)._fingerprint) for s in sources]
        settings = (CACHE_FORMAT, self.size, self.text_field)
        return str(Hasher.hash((data, settings, Hasher.hash(self.tokenizer))))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        with naming_undecodable(self.train_source, self.val_source):
            splits = {"train": self.blocks(self.train_source, folder, "train", keep_partial=False)}
            if self.val_source is not None:
                splits["val"] = self.blocks(self.val_source, folder, "val", keep_partial=True)
        return splits, {"block_size": self.size}

    def blocks(self, source: Source, folder: Path, split: str, keep_partial: bool) -> datasets.Dataset:
        rows = read_text_split(self.reader, source, self.text_field)
        started, workers = time.monotonic(), processes(len(rows), self.processes)
        documents = rows.map(
            Tokenize(self.tokenizer, self.text_field),
            batched=True,
            num_proc=workers if workers > 1 else None,
            remove_columns=rows.column_names,
            features=TOKENS,
            cache_file_name=str(Path(self.reader.scratch()) / f"documents-{split}.arrow"),
            new_fingerprint=f"documents-{split}",
        )
        ends = np.cumsum(IntegerLists(documents, "input_ids").lengths(), dtype=np.int64)
        count = block_count(int(ends[-1]), self.size, keep_partial)
        if not count and keep_partial:
            raise DataError(f"{source.name}: fewer than 2 tokens; evaluation needs some text")
        if not count:
            raise DataError(
                f"{source.name}: too little text for one block of {self.size} tokens; "
                "add data or lower data.max_length"
            )
        blocks = datasets.Dataset.from_dict({"block": np.arange(count)}).map(
            CutBlocks(documents, ends, self.size),
            batched=True,
            batch_size=PACK_BATCH,
            num_proc=workers if workers > 1 and count >= workers else None,
            remove_columns=["block"],
            features=TOKENS,
            cache_file_name=arrow_file(folder, split),
            new_fingerprint=f"blocks-{split}",
        )
        seconds = time.monotonic() - started
        log.info(
            f"tokenized and packed {len(rows)} {split} documents into {count} blocks in {seconds:.1f} s "
            f"with {workers} process(es): {len(rows) / max(seconds, 1e-9):.0f} documents/s"
        )
        return blocks


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    quiet_datasets()
    tokenizer = load_tokenizer(config)
    root = Path(config.output_dir) / "cache"
    with SplitReader(root) as reader:
        prepared = prepare(PackRecipe(config, tokenizer, reader), root, env)
    val = prepared.splits.get("val")
    log.info(f"training on blocks of {prepared.meta['block_size']} tokens")
    return TaskData(
        train=BlockDataset(prepared.splits["train"]),
        val=BlockDataset(val) if val is not None else None,
        collate=Collator(tokenizer.pad_token_id),
        label_names=[],
        preprocessor=tokenizer,
        count_tokens=count_real_tokens,
    )


class Collator:
    """Stacks blocks; only the shorter last validation block needs padding, which gets no loss."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, blocks: list[torch.Tensor]) -> Batch:
        longest = max(len(block) for block in blocks)
        input_ids = torch.full((len(blocks), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(blocks), longest), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(blocks), longest), dtype=torch.long)
        for row, block in enumerate(blocks):
            input_ids[row, : len(block)] = block
            labels[row, : len(block)] = block
            attention_mask[row, : len(block)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def build_model(config: Config, data: TaskData) -> nn.Module:
    model = AutoModelForCausalLM.from_pretrained(
        config.model.pretrained,
        dtype=torch.float32,  # master weights stay fp32; autocast handles bf16/fp16
    )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = data.preprocessor.pad_token_id
    log.info(f"loaded {config.model.pretrained}")
    return model


def _token_losses(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss of predicting token t+1 from tokens <= t, and the mask of positions that count."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
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
    """Tokens that are prediction targets: every labelled position but each row's first."""
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
)
