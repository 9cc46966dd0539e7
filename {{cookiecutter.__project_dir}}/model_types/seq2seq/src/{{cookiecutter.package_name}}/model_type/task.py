"""Sequence to sequence: source texts mapped to target texts, fine-tuning an AutoModelForSeq2SeqLM (T5,
BART, Marian, ...). The data and its cache: pairs.py.

The loss is the cross-entropy of every target token, summed (``loss_sum``) and divided by the target
tokens of the whole optimizer step over every micro-batch and rank (``count_targets``): each token counts
the same whatever the batch it is in. Evaluation reports ``eval_loss`` per target token and
``eval_perplexity``, and, with ``eval.generation_metrics`` (the default), ``eval_bleu`` and
``eval_rougeL`` of targets generated for every validation source (generation.py, text_metrics.py): each
batch adds its statistics, so the scores are those of the whole validation set, for any world size.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from ..config import Config, ConfigError
from ..data.cache import prepare
from ..data.sources import SplitReader, quiet_datasets
from ..observe.log import log
from ..parallel.process_group import DistEnv
from ..task.hugging_face import quiet_transformers, save_pretrained
from ..task.spec import Batch, Task, TaskData, at_least_fp32
from .generation import GENERATION, EvalGeneration, Settings, configure, generate_texts
from .pairs import IGNORE_INDEX, Pair, PairDataset, PairRecipe, source_length
from .text_metrics import SUM_NAMES, generation_metrics, no_text_sums, text_sums


def with_pad_token(tokenizer: Any) -> Any:
    if tokenizer.pad_token is None:  # padding is masked anyway; reuse the end-of-text token
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(pretrained: str) -> Any:
    return with_pad_token(AutoTokenizer.from_pretrained(pretrained))


def decoder_start_token(model_config: Any) -> int:
    """The token the decoder starts from (T5: padding; BART: end-of-text), from the model's config."""
    start = getattr(model_config, "decoder_start_token_id", None)
    if start is None:
        raise ConfigError(
            f"model.pretrained={model_config.name_or_path!r}: its config names no decoder_start_token_id; "
            "use an encoder-decoder checkpoint (T5, BART, Marian, ...)"
        )
    return int(start)


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    quiet_datasets()
    tokenizer = load_tokenizer(config.model.pretrained)
    root = Path(config.output_dir) / "cache"
    with SplitReader(root) as reader:
        prepared = prepare(PairRecipe(config, tokenizer, reader), root, env)
    train = PairDataset(prepared.splits["train"])
    val = PairDataset(prepared.splits["val"]) if "val" in prepared.splits else None
    grouped = config.data.group_by_length
    return TaskData(
        train=train,
        val=val,
        collate=Collator(
            tokenizer.pad_token_id, decoder_start_token(AutoConfig.from_pretrained(config.model.pretrained))
        ),
        label_names=[],
        preprocessor=tokenizer,
        count_tokens=count_tokens,
        train_lengths=train.lengths if grouped else None,
        val_lengths=val.lengths if grouped and val is not None else None,
    )


class Collator:
    """Pads sources and targets to the batch's longest (dynamic padding). The decoder reads the target
    shifted right behind the start token (teacher forcing), as the models' own ``labels`` argument would
    make it. Validation batches also carry each reference's UTF-8 bytes, for BLEU and ROUGE-L."""

    def __init__(self, pad_token_id: int, decoder_start_token_id: int) -> None:
        self.pad, self.start = pad_token_id, decoder_start_token_id

    def __call__(self, items: list[Pair]) -> Batch:
        sources, targets = [item[0] for item in items], [item[1] for item in items]
        input_ids = torch.full((len(items), max(map(len, sources))), self.pad, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        labels = torch.full((len(items), max(map(len, targets))), IGNORE_INDEX, dtype=torch.long)
        for row, (source, target) in enumerate(zip(sources, targets, strict=True)):
            input_ids[row, : len(source)], attention_mask[row, : len(source)] = source, 1
            labels[row, : len(target)] = target
        decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], self.start), labels[:, :-1]], dim=1)
        decoder_input_ids[decoder_input_ids == IGNORE_INDEX] = self.pad
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "labels": labels,
        }
        if len(items[0]) == 3:
            batch.update(reference_bytes([item[2] for item in items]))  # type: ignore[misc]
        return batch


def reference_bytes(references: list[str]) -> dict[str, torch.Tensor]:
    """Texts as a batch's tensors: UTF-8 bytes, one padded row each, and each row's length."""
    encoded = [text.encode("utf-8") for text in references]
    rows = torch.zeros((len(encoded), max(map(len, encoded))), dtype=torch.uint8)
    for row, raw in enumerate(encoded):
        rows[row, : len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return {"references": rows, "reference_lengths": torch.tensor([len(raw) for raw in encoded])}


def references_of(batch: Batch) -> list[str]:
    rows, lengths = batch["references"].cpu(), batch["reference_lengths"].tolist()
    return [bytes(row[:length].tolist()).decode("utf-8") for row, length in zip(rows, lengths, strict=True)]


def count_tokens(batch: Batch) -> int:
    """Source and target tokens that are not padding, counted on the host: no device sync."""
    return int(batch["attention_mask"].sum()) + int((batch["labels"] != IGNORE_INDEX).sum())


def build_model(config: Config, data: TaskData) -> nn.Module:
    model = AutoModelForSeq2SeqLM.from_pretrained(
        config.model.pretrained,
        dtype=torch.float32,  # master weights stay fp32; autocast handles bf16/fp16
    )
    tokenizer = data.preprocessor
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    limit = source_length(config, tokenizer)
    eval_settings = config.eval
    configure(
        model,
        Settings(config.data.source_prefix, limit, eval_settings.max_new_tokens, eval_settings.num_beams),
    )
    metrics = config.eval.generation_metrics and data.val is not None
    setattr(model, GENERATION, EvalGeneration(tokenizer=config.model.pretrained, metrics=metrics))
    log.info(f"loaded {config.model.pretrained}")
    return model


def _token_losses(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss of every target position, and the mask of those that are targets (not padding)."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
        use_cache=False,
    ).logits
    labels = batch["labels"]
    losses = F.cross_entropy(
        at_least_fp32(logits.flatten(0, 1)), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return losses, labels.flatten() != IGNORE_INDEX


def loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    return _token_losses(model, batch)[0].sum()


def count_targets(batch: Batch) -> int:
    return int((batch["labels"] != IGNORE_INDEX).sum())


@cache
def tokenizer_at(pretrained: str) -> Any:
    return load_tokenizer(pretrained)


def evaluation_sums(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    losses, counted = _token_losses(model, batch)
    sums = {"loss": losses.double().sum(), "count": counted.sum().double()}
    generation = getattr(model, GENERATION, None)
    texts = no_text_sums()
    if generation is not None and generation.metrics:
        tokenizer = tokenizer_at(generation.tokenizer)
        predictions = generate_texts(model, tokenizer, batch["input_ids"], batch["attention_mask"])
        texts = text_sums(predictions, references_of(batch))
    device = losses.device
    return sums | {
        name: torch.tensor(value, dtype=torch.float64, device=device) for name, value in texts.items()
    }


def evaluation_metrics(sums: dict[str, float]) -> dict[str, float]:
    loss = sums["loss"] / sums["count"]
    return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)), **generation_metrics(sums)}


def save_final(model: nn.Module, data: TaskData, directory: Path) -> None:
    save_pretrained(model, data.preprocessor, directory)


TASK = Task(
    build_data=build_data,
    build_model=build_model,
    loss_sum=loss_sum,
    count_targets=count_targets,
    evaluation_sums=evaluation_sums,
    sum_names=("loss", "count", *SUM_NAMES),
    evaluation_metrics=evaluation_metrics,
    save_final=save_final,
)
