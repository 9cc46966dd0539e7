"""The bench's own inputs, built offline and deterministically: tiny checkpoints saved with
``save_pretrained`` (loaded by every runner through ``from_pretrained``, as a hub id would be) and the
data of each workload as the generated project reads it (JSON Lines).

Tokenizers and models come from the rendered project's own demo (``model_type/demo.py``), at the bench's
sizes: the text demo's tokenizer makes every word of its vocabulary one token, so the fixed-length
workload really is fixed; the causal demo's grammar writes the documents.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import sys
from pathlib import Path
from types import ModuleType

from transformers.utils import logging as transformers_logging

CLASSES = ["north", "south", "east", "west"]  # each has KEYWORDS_PER_CLASS words that name it
KEYWORDS_PER_CLASS = 3
FILLER_WORDS = 600


def demo_module(project: Path) -> ModuleType:
    """The ``model_type.demo`` module of a rendered project (its package is the one folder in src/)."""
    source = project / "src"
    package = next(path.name for path in source.iterdir() if (path / "__init__.py").exists())
    if str(source) not in sys.path:
        sys.path.insert(0, str(source))
    return importlib.import_module(f"{package}.model_type.demo")


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


def build_classifier(
    directory: Path, demo: ModuleType, hidden: int, layers: int, max_length: int, vocab_size: int = 0
) -> Path:
    """The demo's BERT at this size; ``vocab_size`` > 0 grows its embeddings to a real checkpoint's
    vocabulary (the rows past the tokenizer's are never looked up, but are trained and saved)."""
    filler, keywords = vocabulary()
    tokenizer = demo.build_tokenizer(filler + [w for ws in keywords.values() for w in ws], max_length)
    demo.save_tiny_bert(tokenizer, directory, hidden=hidden, layers=layers, intermediate=4 * hidden)
    if vocab_size:
        from transformers import AutoModelForMaskedLM

        model = AutoModelForMaskedLM.from_pretrained(directory)
        model.resize_token_embeddings(vocab_size)
        model.save_pretrained(directory)
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


def build_tagging(
    directory: Path, demo: ModuleType, size: dict[str, int], train: int, val: int, seed: int
) -> dict[str, str]:
    """Sentences of 4 to 60 filler words (one token each) with 1 to 3 of the token demo's entities (people,
    places, organisations, spelled out in several tokens) in IOB2 tags, and the demo's BERT of ``size``
    (hidden, layers, context): {model, train_file, val_file}."""
    filler, _ = vocabulary()
    rng = random.Random(seed)
    paths = {}
    for name, count in (("train_file", train), ("val_file", val)):
        rows = []
        for _ in range(count):
            tokens = [rng.choice(filler) for _ in range(log_uniform_length(rng, 4, 60))]
            tags = ["O"] * len(tokens)
            for _ in range(rng.randint(1, 3)):
                kind = rng.choice(sorted(demo.ENTITIES))
                words = rng.choice(demo.ENTITIES[kind])
                # never inside another entity: between words, or before a B- tag
                place = rng.choice([i for i, tag in enumerate([*tags, "O"]) if not tag.startswith("I-")])
                tokens[place:place] = words
                tags[place:place] = [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - 1)
            rows.append({"tokens": tokens, "tags": tags})
        paths[name] = directory / f"{name.removesuffix('_file')}.jsonl"
        write_jsonl(paths[name], rows)
    names = [word for choices in demo.ENTITIES.values() for entity in choices for word in entity]
    tokenizer = demo.build_tokenizer(filler, names, size["context"])
    model = directory / "model"
    demo.save_tiny_bert(
        tokenizer, model, hidden=size["hidden"], layers=size["layers"], intermediate=4 * size["hidden"]
    )
    return {"model": str(model), **{name: str(path) for name, path in paths.items()}}


def build_causal(
    directory: Path, demo: ModuleType, size: dict[str, int], train: int, val: int, seed: int
) -> dict[str, str]:
    """Documents of the causal demo's grammar, its tokenizer trained on them, a GPT-2 of ``size``
    (hidden, layers, context): {model, train_file, val_file}."""
    rng = random.Random(seed)
    paths, corpus = {}, []
    for name, count in (("train_file", train), ("val_file", val)):
        paths[name] = directory / f"{name.removesuffix('_file')}.jsonl"
        corpus += demo.write_split(paths[name], rng, count)
    model = directory / "model"
    tokenizer = demo.build_tokenizer(corpus, size["context"])
    demo.save_tiny_gpt2(tokenizer, model, size["hidden"], size["layers"], max(1, size["hidden"] // 32))
    return {"model": str(model), **{name: str(path) for name, path in paths.items()}}


def build_instructions(
    directory: Path,
    demo: ModuleType,
    size: dict[str, int],
    train: int,
    val: int,
    seed: int,
    pretraining_steps: int,
) -> dict[str, str]:
    """Prompt/completion pairs of the causal demo's grammar (a document of 1-4 sentences, then a
    question about one more; the answer, 1-4 words, completes it), its tokenizer trained on them and a
    GPT-2 of ``size``: {model, train_file, val_file}."""
    rng = random.Random(seed)
    paths, corpus = {}, []
    for name, count in (("train_file", train), ("val_file", val)):
        paths[name] = directory / f"{name.removesuffix('_file')}.jsonl"
        rows = []
        for _ in range(count):
            sentence, [(question, answer), _] = demo.instruction(rng)
            rows.append({"prompt": f"{demo.document(rng)} {sentence} {question}", "completion": f" {answer}"})
            corpus += [rows[-1]["prompt"] + rows[-1]["completion"]]
        paths[name].write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    documents = [demo.document(rng) for _ in range(PRETRAINING_DOCUMENTS)]
    model = directory / "model"
    tokenizer = demo.build_tokenizer(corpus + documents, size["context"])
    demo.save_tiny_gpt2(tokenizer, model, size["hidden"], size["layers"], max(1, size["hidden"] // 32))
    pretrain(model, documents, size["context"], pretraining_steps)
    return {"model": str(model), **{name: str(path) for name, path in paths.items()}}


def build_seq2seq(
    directory: Path, demo: ModuleType, size: dict[str, int], train: int, val: int, seed: int
) -> dict[str, str]:
    """Sentence/gist pairs of the seq2seq demo, its tokenizer trained on them and a BART of ``size``
    (hidden, layers, context): {model, train_file, val_file}."""
    rng = random.Random(seed)
    paths, corpus = {}, []
    for name, count in (("train_file", train), ("val_file", val)):
        paths[name] = directory / f"{name.removesuffix('_file')}.jsonl"
        corpus += demo.write_split(paths[name], rng, count)
    model = directory / "model"
    demo.save_tiny_bart(demo.build_tokenizer(corpus, size["context"]), model, size["hidden"], size["layers"])
    return {"model": str(model), **{name: str(path) for name, path in paths.items()}}


PRETRAINING_DOCUMENTS = 4000


def pretrain(model_dir: Path, documents: list[str], context: int, steps: int) -> None:
    """A base model that knows the grammar, as a pretrained checkpoint does: its every weight trained on
    plain documents (no questions), so that adapters on top of it have something to adapt. A random
    model's frozen embeddings cannot express a confident prediction, whatever adapters learn."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer(documents, add_special_tokens=False)["input_ids"]
    stream = torch.tensor([token for document in ids for token in (*document, tokenizer.eos_token_id)])
    blocks = stream[: len(stream) // context * context].view(-1, context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        batch = blocks[torch.randint(len(blocks), (16,))]
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(model_dir)


def quiet() -> None:
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
