"""Causal language modelling: JSON Lines with ``text``, fine-tuning an AutoModelForCausalLM.

Documents are tokenized once (rank 0, shared with the other ranks through a cache file under
``output_dir/cache``), joined with the end-of-text token into one stream and cut into blocks of
``data.max_length`` tokens, capped by the model's context. Consecutive blocks overlap by one token, so
every token after the first is a prediction target exactly once. Training uses full blocks only, so every
rank's batch holds the same number of tokens; validation keeps the shorter last block, so evaluation
scores every validation token exactly once across ranks.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ..config import Config, ConfigError
from ..data import DataError, cached, chunks, fingerprint, iter_jsonl
from ..distributed import DistEnv
from ..hf import quiet_transformers, save_pretrained
from ..log import log
from ..task_spec import Batch, Task, TaskData, at_least_fp32, count_real_tokens

FIELDS = ("text",)
IGNORE_INDEX = -100  # label of padding: no loss
TOKENIZE_CHUNK = 1024  # lines per tokenizer call: bounded memory on rank 0, whatever the file size


class BlockDataset(Dataset):
    """Blocks of ``size`` tokens viewed out of one token stream, overlapping by one token.

    Block i starts at i * (size - 1), so each token after the first is a prediction target exactly once.
    Views cost no memory beyond the stream itself.
    """

    def __init__(self, stream: torch.Tensor, size: int, keep_partial: bool) -> None:
        self.stream, self.size, self.stride = stream, size, size - 1
        if keep_partial:  # every start that leaves at least one target
            self.count = math.ceil((len(stream) - 1) / self.stride) if len(stream) >= 2 else 0
        else:
            self.count = (len(stream) - size) // self.stride + 1 if len(stream) >= size else 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.count:
            raise IndexError(index)
        start = index * self.stride
        return self.stream[start : start + self.size]


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


def token_stream(path: str, tokenizer: Any) -> torch.Tensor:
    """The file's documents as one int32 token stream, each followed by the end-of-text token.

    Tokenized a chunk of lines at a time, so rank 0 never holds a large file as Python lists.
    """
    pieces = []
    for rows in chunks(iter_jsonl(path, FIELDS), TOKENIZE_CHUNK):
        for row in rows:
            if not isinstance(row["text"], str):
                raise DataError(f"{path}:{row['_line']}: field 'text' must be a string")
        encoded = tokenizer([row["text"] for row in rows], add_special_tokens=False)["input_ids"]
        stream = itertools.chain.from_iterable((*ids, tokenizer.eos_token_id) for ids in encoded)
        pieces.append(torch.tensor(list(stream), dtype=torch.int32))  # batches are int64 again
    return torch.cat(pieces)


def preprocess(config: Config, tokenizer: Any) -> dict[str, Any]:
    size = block_size(config)
    train_path = config.data.train_file
    train = BlockDataset(token_stream(train_path, tokenizer), size, False)
    if not len(train):
        raise DataError(
            f"{train_path}: too little text for one block of {size} tokens; add data or lower data.max_length"
        )
    val = None
    if config.data.val_file:
        val_path = config.data.val_file
        val = BlockDataset(token_stream(val_path, tokenizer), size, True)
        if not len(val):
            raise DataError(f"{val_path}: fewer than 2 tokens; evaluation needs some text")
    return {"train": train, "val": val, "block_size": size}


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    key = fingerprint(
        Path(config.data.train_file),
        Path(config.data.val_file) if config.data.val_file else None,
        config.model.pretrained,
        config.data.max_length,
    )
    cache_file = Path(config.output_dir) / "cache" / f"causal-lm-{key}.pt"
    tokenizer = load_tokenizer(config)
    processed = cached(cache_file, lambda: preprocess(config, tokenizer), env, [BlockDataset])
    log.info(f"training on blocks of {processed['block_size']} tokens")
    return TaskData(
        train=processed["train"],
        val=processed["val"],
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
