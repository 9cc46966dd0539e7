"""A tiny BERT with its own WordPiece tokenizer, and a three-class sentiment data set with string labels."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

WORDS = {
    "positive": ["great", "wonderful", "loved", "excellent", "delightful", "superb", "enjoyed"],
    "negative": ["awful", "terrible", "hated", "boring", "dreadful", "poor", "disappointing"],
    "neutral": ["okay", "average", "fine", "ordinary", "acceptable", "standard", "plain"],
}
SUBJECTS = ["the film", "this book", "the service", "our trip", "the meal", "the concert", "the game"]
FILLER = ["really", "quite", "honestly", "overall", "to be fair", "in the end", "mostly", "simply"]
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Overrides that make two runs on the demo differ by their arithmetic only: none needed here.
REPRODUCIBLE: list[str] = []


def sentence(rng: random.Random, label: str) -> str:
    words = [rng.choice(SUBJECTS), "was", rng.choice(FILLER), rng.choice(WORDS[label])]
    if rng.random() < 0.5:
        words += ["and", rng.choice(FILLER), rng.choice(WORDS[label])]
    return " ".join(words).capitalize() + rng.choice([".", "!", "..."])


def write_split(path: Path, rng: random.Random, count: int) -> list[str]:
    texts, rows = [], []
    for _ in range(count):
        label = rng.choice(sorted(WORDS))
        texts.append(sentence(rng, label))
        rows.append(json.dumps({"text": texts[-1], "label": label}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return texts


def build_tokenizer(corpus: list[str], max_length: int = 128) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer whose vocabulary is every word of the corpus, in sorted order, plus single
    characters for anything else: the same ids on every build (a trained vocabulary's are not), and
    each word of the corpus one token (the template's bench builds its fixed-length texts on that)."""
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = {
        word for text in corpus for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    }
    characters = {character for word in words for character in word}
    pieces = [*SPECIAL_TOKENS, *sorted(words | characters), *sorted(f"##{c}" for c in characters)]
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
    corpus = write_split(directory / "train.jsonl", rng, 600)
    corpus += write_split(directory / "val.jsonl", rng, 101)  # not a multiple of the world size
    model_dir = directory / "model"
    save_tiny_bert(build_tokenizer(corpus), model_dir, hidden=64, layers=2, intermediate=128)
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
