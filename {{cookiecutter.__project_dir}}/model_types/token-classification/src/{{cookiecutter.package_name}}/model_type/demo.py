"""A tiny BERT with its own WordPiece tokenizer, and a named-entity data set (IOB2 tags: people, places,
organisations) whose names are not in the vocabulary: they split into several tokens, as rare words do."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

ENTITIES = {
    "PER": [
        ["Ada", "Lovelace"],
        ["Alan", "Turing"],
        ["Grace", "Hopper"],
        ["Marie"],
        ["Linus"],
        ["Ines", "Ortega"],
    ],
    "LOC": [["Paris"], ["New", "Zealand"], ["Lagos"], ["Kyoto"], ["Rio", "de", "Janeiro"], ["Oslo"]],
    "ORG": [["Acme", "Corp"], ["Globex"], ["Initech"], ["Umbrella", "Group"], ["Hooli"], ["Vandelay"]],
}
# Sentence patterns: plain words, and the slots an entity of a type fills.
PATTERNS = [
    ["PER", "met", "PER", "in", "LOC", "."],
    ["PER", "works", "for", "ORG", "."],
    ["ORG", "opened", "an", "office", "in", "LOC", "last", "year", "."],
    ["Yesterday", "PER", "flew", "to", "LOC", "with", "PER", "."],
    ["The", "weather", "in", "LOC", "was", "fine", "."],
    ["ORG", "hired", "PER", "."],
    ["Nothing", "happened", "today", "."],
]
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Overrides that make two runs on the demo differ by their arithmetic only: none needed here.
REPRODUCIBLE: list[str] = []


def sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    tokens: list[str] = []
    tags: list[str] = []
    for slot in rng.choice(PATTERNS):
        if slot in ENTITIES:
            words = rng.choice(ENTITIES[slot])
            tokens += words
            tags += [f"B-{slot}"] + [f"I-{slot}"] * (len(words) - 1)
        else:
            tokens.append(slot)
            tags.append("O")
    return tokens, tags


def write_split(path: Path, rng: random.Random, count: int) -> None:
    rows = []
    for _ in range(count):
        tokens, tags = sentence(rng)
        rows.append(json.dumps({"tokens": tokens, "tags": tags}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def build_tokenizer(words: list[str], spelled: list[str], max_length: int = 128) -> PreTrainedTokenizerFast:
    """A cased WordPiece tokenizer whose vocabulary is ``words`` and the characters of ``words`` and
    ``spelled``, in sorted order: the same ids on every build, and the ``spelled`` words split into
    characters."""
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=False), pre_tokenizers.BertPreTokenizer()
    characters = {character for word in [*words, *spelled] for character in word}
    pieces = [*SPECIAL_TOKENS, *sorted(set(words) | characters), *sorted(f"##{c}" for c in characters)]
    tokenizer = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )


def save_tiny_bert(
    tokenizer: PreTrainedTokenizerFast, directory: Path, hidden: int, layers: int, intermediate: int
) -> None:
    """A BERT of ``hidden`` units in ``layers`` layers for ``tokenizer``, saved with it; seeded, so the
    demo's result does not hang on a lucky draw."""
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        intermediate_size=intermediate,
        max_position_embeddings=tokenizer.model_max_length,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def build(directory: Path) -> list[str]:
    transformers_logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    write_split(directory / "train.jsonl", rng, 600)
    write_split(directory / "val.jsonl", rng, 101)  # not a multiple of the world size
    plain_words = sorted({slot for pattern in PATTERNS for slot in pattern if slot not in ENTITIES})
    model_dir = directory / "model"
    names = [word for choices in ENTITIES.values() for name in choices for word in name]
    save_tiny_bert(build_tokenizer(plain_words, names), model_dir, hidden=64, layers=2, intermediate=128)
    return [
        f"model.pretrained={model_dir}",
        f"data.train_file={directory / 'train.jsonl'}",
        f"data.val_file={directory / 'val.jsonl'}",
        "output_dir=outputs/demo",
        "data.batch_size=16",
        "train.epochs=4",
        "train.lr=5e-3",
        "train.warmup_ratio=0.1",
        "data.num_workers=0",
    ]
