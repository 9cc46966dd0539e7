"""A tiny GPT-2 with its own byte-level BPE tokenizer (no pad token and no chat template, like GPT-2), a
small corpus of documents, and instruction data for the same model: prompt/completion pairs and chat
conversations, with a chat template beside them (``chat_template.jinja``)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

END = "<|endoftext|>"
SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird", "our neighbour"]
VERBS = ["saw", "liked", "followed", "painted", "found", "called", "helped"]
OBJECTS = ["the red ball", "a green box", "the tall tree", "a quiet river", "the blue house", "a warm cup"]
PLACES = ["in the park", "at home", "by the sea", "after school", "in the morning", "near the bridge"]

# Overrides that make two runs on the demo differ by their arithmetic only: none needed here.
REPRODUCIBLE: list[str] = []


def document(rng: random.Random) -> str:
    sentences = [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}."
        for _ in range(rng.randint(1, 4))
    ]
    return " ".join(sentence.capitalize() for sentence in sentences)


def write_split(path: Path, rng: random.Random, count: int) -> list[str]:
    texts = [document(rng) for _ in range(count)]
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return texts


def instruction(rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """A sentence, and two questions about it with their answers, of 1 to about 4 words each."""
    subject, verb, thing, place = (rng.choice(words) for words in (SUBJECTS, VERBS, OBJECTS, PLACES))
    sentence = f"{subject} {verb} {thing} {place}.".capitalize()
    questions = [("Who?", subject), ("What?", thing), ("Where?", place), ("Did what?", verb)]
    return sentence, rng.sample(questions, 2)


def write_instructions(directory: Path, name: str, rng: random.Random, count: int) -> None:
    """``instructions-<name>.jsonl`` of prompt/completion pairs and ``chat-<name>.jsonl`` of
    conversations of one or two questions."""
    pairs, chats = [], []
    for _ in range(count):
        sentence, ((question, answer), (follow_up, second)) = instruction(rng)
        pairs.append({"prompt": f"{sentence} {question}", "completion": f" {answer}"})
        messages = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"{sentence} {question}"},
            {"role": "assistant", "content": answer},
        ]
        if rng.random() < 0.5:
            messages += [{"role": "user", "content": follow_up}, {"role": "assistant", "content": second}]
        chats.append({"messages": messages})
    for path, records in ((f"instructions-{name}.jsonl", pairs), (f"chat-{name}.jsonl", chats)):
        text = "".join(json.dumps(record) + "\n" for record in records)
        (directory / path).write_text(text, encoding="utf-8")


def build_tokenizer(corpus: list[str], max_length: int = 128) -> PreTrainedTokenizerFast:
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        corpus, vocab_size=400, min_frequency=1, special_tokens=[END], show_progress=False
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer._tokenizer,
        bos_token=END,
        eos_token=END,
        unk_token=END,
        model_max_length=max_length,
    )


def save_tiny_gpt2(
    tokenizer: PreTrainedTokenizerFast, directory: Path, hidden: int, layers: int, heads: int
) -> None:
    """A GPT-2 of ``hidden`` units in ``layers`` layers of ``heads`` heads for ``tokenizer``, saved with
    it; seeded, so the demo's result does not hang on a lucky draw."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=tokenizer.model_max_length,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def build(directory: Path) -> list[str]:
    transformers_logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    corpus = write_split(directory / "train.jsonl", rng, 400)
    corpus += write_split(directory / "val.jsonl", rng, 41)
    model_dir = directory / "model"
    save_tiny_gpt2(build_tokenizer(corpus), model_dir, hidden=32, layers=2, heads=2)
    instructions = random.Random(1)  # a stream of its own: the documents above stay as they were
    write_instructions(directory, "train", instructions, 400)
    write_instructions(directory, "val", instructions, 40)
    shutil.copyfile(Path(__file__).with_name("chat_template.jinja"), directory / "chat_template.jinja")
    return [
        f"model.pretrained={model_dir}",
        f"data.train_file={directory / 'train.jsonl'}",
        f"data.val_file={directory / 'val.jsonl'}",
        "output_dir=outputs/demo",
        "data.max_length=64",
        "data.batch_size=8",
        "train.epochs=3",
        "train.lr=1e-2",
        "train.warmup_ratio=0.1",
        "data.num_workers=0",
    ]
