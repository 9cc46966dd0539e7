"""A tiny BART with its own byte-level BPE tokenizer, built here (nothing is downloaded), and pairs of a
sentence (the source) and its gist (the target: who did what to what, without where)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from tokenizers.processors import TemplateProcessing
from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]  # BART's ids: 0 start, 1 padding, 2 end, 3 unknown
SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "our neighbour"]
VERBS = ["saw", "liked", "followed", "painted", "found", "called", "helped"]
OBJECTS = ["the red ball", "a green box", "the tall tree", "a quiet river", "the blue house", "a warm cup"]
PLACES = ["in the park", "at home", "by the sea", "after school", "in the morning", "near the bridge"]

# Overrides that make two runs on the demo differ by their arithmetic only: BART's dropout draws from
# every rank's own generator.
REPRODUCIBLE: list[str] = []


def pair(rng: random.Random) -> dict[str, str]:
    subject, verb, thing, place = (rng.choice(words) for words in (SUBJECTS, VERBS, OBJECTS, PLACES))
    return {
        "source": f"{subject} {verb} {thing} {place}.".capitalize(),
        "target": f"{subject} {verb} {thing}",
    }


def write_split(path: Path, rng: random.Random, count: int) -> list[str]:
    pairs = [pair(rng) for _ in range(count)]
    path.write_text("".join(json.dumps(record) + "\n" for record in pairs), encoding="utf-8")
    return [text for record in pairs for text in record.values()]


def build_tokenizer(corpus: list[str], max_length: int = 128) -> PreTrainedTokenizerFast:
    """BPE over bytes, trained on the demo's texts; every text becomes <s> ... </s>, as BART's does."""
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        corpus, vocab_size=400, min_frequency=1, special_tokens=SPECIAL, show_progress=False
    )
    tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer._tokenizer,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


def save_tiny_bart(tokenizer: PreTrainedTokenizerFast, directory: Path, hidden: int, layers: int) -> None:
    """A BART of ``hidden`` units, ``layers`` encoder and decoder layers of 2 heads, for ``tokenizer``,
    saved with it; seeded, so the demo's result does not hang on a lucky draw."""
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=hidden,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=hidden * 2,
        decoder_ffn_dim=hidden * 2,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    torch.manual_seed(0)
    BartForConditionalGeneration(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def build(directory: Path) -> list[str]:
    transformers_logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    corpus = write_split(directory / "train.jsonl", rng, 400)
    corpus += write_split(directory / "val.jsonl", rng, 41)
    model_dir = directory / "model"
    save_tiny_bart(build_tokenizer(corpus), model_dir, hidden=64, layers=2)
    return [
        f"model.pretrained={model_dir}",
        f"data.train_file={directory / 'train.jsonl'}",
        f"data.val_file={directory / 'val.jsonl'}",
        "output_dir=outputs/demo",
        "data.max_length=64",
        "data.batch_size=8",
        "train.epochs=3",
        "train.lr=5e-3",
        "train.warmup_ratio=0.1",
        "eval.max_new_tokens=24",
        "data.num_workers=0",
    ]
