"""The bench's own inputs, built offline and deterministically: tiny checkpoints saved with
``save_pretrained`` (loaded by every runner through ``from_pretrained``, as a hub id would be) and the
data of each workload as the generated project reads it (JSON Lines).

Word-level tokenizers make every word exactly one token, so the fixed-length workload really is fixed.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
END = "<|endoftext|>"
CLASSES = ["north", "south", "east", "west"]  # each has KEYWORDS_PER_CLASS words that name it
KEYWORDS_PER_CLASS = 3
FILLER_WORDS = 600


def _words(rng: random.Random, count: int, length: int = 6) -> list[str]:
    found: set[str] = set()
    while len(found) < count:
        found.add("".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(length // 2)))
    return sorted(found)


def vocabulary() -> tuple[list[str], dict[str, list[str]]]:
    """Filler words and each class's keywords, the same on every machine."""
    rng = random.Random(1)
    words = _words(rng, FILLER_WORDS + len(CLASSES) * KEYWORDS_PER_CLASS)
    rng.shuffle(words)
    keywords = {
        name: words[FILLER_WORDS + i * KEYWORDS_PER_CLASS : FILLER_WORDS + (i + 1) * KEYWORDS_PER_CLASS]
        for i, name in enumerate(CLASSES)
    }
    return words[:FILLER_WORDS], keywords


def word_tokenizer(words: list[str], bert_style: bool, max_length: int) -> PreTrainedTokenizerFast:
    specials = SPECIALS if bert_style else [END]
    vocab = {token: index for index, token in enumerate([*specials, *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=specials[1] if bert_style else END))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bert_style:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
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
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=END, eos_token=END, unk_token=END, model_max_length=max_length
    )


def classification_text(
    rng: random.Random, filler: list[str], keywords: dict[str, list[str]], words: int, mentions: int
):
    """``words`` filler words with ``mentions`` keywords of a random class at random places: the label."""
    label = rng.choice(CLASSES)
    text = [rng.choice(filler) for _ in range(words)]
    for place in rng.sample(range(min(words, 60)), min(mentions, words)):  # inside any truncation
        text[place] = rng.choice(keywords[label])
    return " ".join(text), label


def log_uniform_length(rng: random.Random, low: int, high: int) -> int:
    """Many short samples and a long tail, as in real text data."""
    return int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def build_classifier(directory: Path, hidden: int, layers: int, max_length: int) -> Path:
    filler, keywords = vocabulary()
    tokenizer = word_tokenizer(filler + [w for ws in keywords.values() for w in ws], True, max_length)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        intermediate_size=4 * hidden,
        max_position_embeddings=max_length,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_classification_data(
    directory: Path, train: int, val: int, words: tuple[int, int], mentions: int, seed: int
) -> tuple[Path, Path]:
    """``words``: (low, high) words per text, low == high gives fixed-length texts; ``mentions``: how
    often the class keyword appears in each (at most once per word)."""
    filler, keywords = vocabulary()
    rng = random.Random(seed)
    paths = []
    for name, count in (("train", train), ("val", val)):
        rows = []
        for _ in range(count):
            length = words[0] if words[0] == words[1] else log_uniform_length(rng, *words)
            text, label = classification_text(rng, filler, keywords, length, mentions)
            rows.append({"text": text, "label": label})
        paths.append(directory / f"{name}.jsonl")
        write_jsonl(paths[-1], rows)
    return paths[0], paths[1]


def build_causal_lm(directory: Path, hidden: int, layers: int, context: int) -> Path:
    tokenizer = word_tokenizer(_grammar_words(), False, context)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=context,
        n_embd=hidden,
        n_layer=layers,
        n_head=max(1, hidden // 32),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "our neighbour"]
VERBS = ["saw", "liked", "followed", "painted", "found", "called", "helped", "carried"]
OBJECTS = ["the red ball", "a green box", "the tall tree", "a quiet river", "the blue house", "a warm cup"]
PLACES = ["in the park", "at home", "by the sea", "after school", "in the morning", "near the bridge"]


def _grammar_words() -> list[str]:
    phrases = SUBJECTS + VERBS + OBJECTS + PLACES
    return sorted({word for phrase in phrases for word in phrase.split()} | {"."})


def build_causal_data(directory: Path, train: int, val: int, seed: int) -> tuple[Path, Path]:
    rng = random.Random(seed)

    def document() -> str:
        sentences = [
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)} ."
            for _ in range(rng.randint(1, 6))
        ]
        return " ".join(sentences)

    paths = []
    for name, count in (("train", train), ("val", val)):
        paths.append(directory / f"{name}.jsonl")
        write_jsonl(paths[-1], [{"text": document()} for _ in range(count)])
    return paths[0], paths[1]


def quiet() -> None:
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
