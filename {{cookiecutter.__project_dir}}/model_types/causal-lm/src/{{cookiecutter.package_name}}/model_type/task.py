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

from ..arrow_rows import IntegerLists
from ..config import Config, ConfigError
from ..data import DataError
from ..data_cache import RECORD_BATCH_ROWS, arrow_file, prepare, processes
from ..data_sources import (
    Source,
    SplitReader,
    naming_undecodable,
    quiet_datasets,
    require_fields,
    require_text,
    split_sources,
)
from ..distributed import DistEnv
from ..hf import quiet_transformers, save_pretrained
from ..log import log
from ..model import unwrap
from ..task_spec import Batch, Task, TaskData, at_least_fp32, count_real_tokens
from .generation import generate
from .instructions import IGNORE_INDEX, SampleDataset, detect_format, samples
from .packing import PACK_BATCH, TOKENS, BlockDataset, CutBlocks, Tokenize, block_count
from .padding_free import (
    SAMPLES_APART,
    attends_within_samples,
    model_inputs,
    the_form_for,
    with_packed_row,
    worth_trying,
)
from .settings import PaddingFree

CACHE_FORMAT = 3  # of the packed blocks; part of their key, so an older layout is never read


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
        self.template = Path(data.chat_template).read_text(encoding="utf-8") if data.chat_template else None

    def key(self) -> str:
        sources = [self.train_source, self.val_source]
        # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
        data = [s and (s.fingerprint() or self.reader.read(s)._fingerprint) for s in sources]
        settings = (CACHE_FORMAT, self.size, self.text_field, self.template)
        return str(Hasher.hash((data, settings, Hasher.hash(self.tokenizer))))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        warnings: list[str] = []
        with naming_undecodable(self.train_source, self.val_source):
            splits = {"train": self.split(self.train_source, folder, "train", warnings)}
            if self.val_source is not None:
                splits["val"] = self.split(self.val_source, folder, "val", warnings)
        return splits, {"block_size": self.size, "warnings": warnings}

    def split(self, source: Source, folder: Path, split: str, warnings: list[str]) -> datasets.Dataset:
        rows = self.reader.read(source)
        kind = detect_format(rows, source, self.text_field)
        if kind != "text":
            encoding = (self.tokenizer, self.size, self.template, self.processes)
            return samples(self.reader, rows, source, kind, encoding, folder, split, warnings)
        require_fields(rows, source, (self.text_field,))
        require_text(rows, source, self.text_field)
        return self.blocks(rows, source, folder, split, keep_partial=split == "val")

    def blocks(
        self, rows: datasets.Dataset, source: Source, folder: Path, split: str, keep_partial: bool
    ) -> datasets.Dataset:
        started, workers = time.monotonic(), processes(len(rows), self.processes)
        documents = rows.map(
            Tokenize(self.tokenizer, self.text_field),
            batched=True,
            num_proc=workers if workers > 1 else None,
            remove_columns=rows.column_names,
            features=TOKENS,
            writer_batch_size=RECORD_BATCH_ROWS,
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
            writer_batch_size=RECORD_BATCH_ROWS,
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
            tokenizer.pad_token_id, padding_free=config.data.padding_free is not PaddingFree.never
        ),
        label_names=[],
        preprocessor=tokenizer,
        count_tokens=count_real_tokens,
        train_lengths=lengths(train),
        val_lengths=lengths(val),
    )


def as_dataset(rows: datasets.Dataset | None) -> SampleDataset | BlockDataset | None:
    """Instruction samples carry their labels; packed blocks are their own labels."""
    if rows is None:
        return None
    return SampleDataset(rows) if "labels" in rows.column_names else BlockDataset(rows)


def lengths(dataset: Dataset | None) -> torch.Tensor | None:
    """Sample lengths, for length grouping; None for blocks, which all have one length."""
    return torch.from_numpy(dataset.lengths()) if isinstance(dataset, SampleDataset) else None


class Collator:
    """Pads a batch on the right, with no loss on padding: instruction samples of many lengths, or blocks
    (only the shorter last validation block needs padding). A block is its own labels. A batch of
    instruction samples also carries them end to end in one row, for models that train padding-free
    (padding_free.py)."""

    def __init__(self, pad_token_id: int, padding_free: bool = False) -> None:
        self.pad_token_id, self.padding_free = pad_token_id, padding_free

    def __call__(self, items: list[torch.Tensor] | list[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
        pairs = [item if isinstance(item, tuple) else (item, item) for item in items]
        longest = max(len(ids) for ids, _ in pairs)
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
            log.info(
                "instruction samples padded, grouped by length: a padding-free row pays with flash attention "
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
