"""Inputs of the data-scale bench, built offline once and reused: a MiniLM-shaped checkpoint and data.

The tokenizer is a BERT-style WordPiece of 30,522 pieces (lower-cased, [CLS] ... [SEP]), trained here on
the generated text, as all-MiniLM-L6-v2's is shaped; the model is a randomly initialised BERT with
MiniLM-L6's dimensions (6 layers, 384 wide, 12 heads). Texts are pseudo-English words, 10 to a few hundred
per line (log-normal, about 65 on average), labelled with one of three class names.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

SEED = 0
VOCABULARY_WORDS = 40_000
TOKENIZER_TRAINING_LINES = 50_000
LABELS = ("negative", "neutral", "positive")


def words(rng: random.Random) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ou", "ea")]
    return [
        "".join(rng.choices(syllables, k=rng.choice((1, 2, 2, 3, 3, 4)))) for _ in range(VOCABULARY_WORDS)
    ]


def write_lines(path: Path, count: int) -> None:
    rng = random.Random(SEED)
    vocabulary = words(rng)
    cumulative = list(itertools.accumulate(1 / (rank + 10) for rank in range(len(vocabulary))))  # Zipf-like
    partial = path.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as handle:
        for _ in range(count):
            length = min(int(rng.lognormvariate(4.0, 0.6)) + 5, 400)
            text = " ".join(rng.choices(vocabulary, cum_weights=cumulative, k=length)).capitalize() + "."
            handle.write(json.dumps({"text": text, "label": rng.choice(LABELS)}) + "\n")
    partial.rename(path)


def write_prefix(source: Path, path: Path, count: int) -> None:
    """The first ``count`` lines of the largest file: the sizes differ by volume only."""
    partial = path.with_suffix(".partial")
    with source.open(encoding="utf-8") as lines, partial.open("w", encoding="utf-8") as handle:
        handle.writelines(itertools.islice(lines, count))
    partial.rename(path)


def build_checkpoint(directory: Path, corpus: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    with corpus.open(encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in itertools.islice(handle, TOKENIZER_TRAINING_LINES)]
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=30_522, special_tokens=special))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    config = BertConfig(
        vocab_size=fast.vocab_size,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        num_labels=len(LABELS),
    )
    torch.manual_seed(SEED)
    BertForSequenceClassification(config).save_pretrained(directory)
    fast.save_pretrained(directory)


def build(directory: Path, sizes: list[int]) -> dict:
    """Paths of the checkpoint (``"model"``) and of each size's training file; built where missing."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs: dict = {}
    largest = directory / f"train-{max(sizes)}.jsonl"
    if not largest.exists():
        write_lines(largest, max(sizes))
    for size in sorted(sizes):
        path = directory / f"train-{size}.jsonl"
        if not path.exists():
            write_prefix(largest, path, size)
        inputs[size] = str(path)
    model = directory / "minilm-shaped"
    if not (model / "model.safetensors").exists():
        build_checkpoint(model, largest)
    inputs["model"] = str(model)
    return inputs
