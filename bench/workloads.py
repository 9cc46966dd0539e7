"""The workloads, as one declarative table, and the identical settings every runner gets."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import assets
from transformers import AutoTokenizer


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    train_size: int
    val_size: int
    epochs: int
    model_type: str = "text-classification"  # of the generated project that runs it
    metric: str = "eval_accuracy"  # the eval metric reported; time and steps to target use it
    higher_is_better: bool = True
    words: tuple[int, int] = (6, 250)  # words per text (classification); low == high: fixed length
    mentions: int = 1  # times the class keyword appears in a text (classification)
    max_length: int = 256
    batch_size: int = 16  # per process, of WORLD_SIZE processes: the global batch is the same for all
    lr: float = 1e-3
    eval_every_steps: int = 0  # 0: only at the end
    log_every_steps: int = 8  # the project's; divides eval_every_steps (an evaluation starts at a record)
    hidden: int = 64
    layers: int = 2
    vocab_size: int = 0  # of the classifier's embeddings; 0: its tokenizer's (the demo's small vocabulary)
    runners: tuple[str, ...] = ()  # empty: every runner meant for it (runs.runs_on)
    seeds_per_round: int = 1  # runs of each runner per round, each with its own training seed
    target: float = 0.0  # steps to target: the metric a run must reach (0: the reference's final one)
    reference: str = "plain"  # the runner whose final metric is the time-to-target, and the ratios' base
    instructions: bool = False  # causal-lm: prompt/completion pairs, loss on the completions
    lora: tuple[tuple[str, object], ...] = ()  # LoRA adapters (the project's lora.* keys), else full
    pretraining_steps: int = 300  # instructions: steps that teach the base model the grammar (assets.py)


# LoRA as the project's lora section defaults it, for the project and the peers alike.
LORA = (("r", 16), ("alpha", 32), ("dropout", 0.05), ("target_modules", "all-linear"))
FIXED = Workload(
    name="fixed",
    title="(a) text classification, fixed length (pure overhead)",
    train_size=8192,
    val_size=512,
    epochs=1,
    words=(80, 80),  # truncated to max_length: every sample is exactly 64 tokens
    mentions=4,  # learnable within the epoch: its accuracy column is not a coin toss
    max_length=64,
)
VARIABLE = Workload(
    name="variable",
    title="(b) text classification, variable length (realistic padding)",
    train_size=4096,  # log-uniform lengths: many short texts, a long tail
    val_size=512,
    epochs=2,
    eval_every_steps=32,
)
WORKLOADS = {
    "fixed": FIXED,
    "variable": VARIABLE,
    # (b)'s data for one epoch, evaluated often, over several seeds: what a step learns, not how fast
    # it runs. The labels do not depend on the length, and the signal is one word among the filler.
    "steps": replace(
        VARIABLE,
        name="steps",
        title="(d) sample efficiency: (b)'s data, one epoch (128 steps), several seeds",
        epochs=1,
        eval_every_steps=16,
        runners=("project", "project-random", "trainer-grouped"),
        seeds_per_round=3,  # 9 seeds in 3 rounds: a run either learns the keyword or does not
        target=0.9,
    ),
    # Threads per process: (a)'s texts, a quarter of them, since a run of several threads per process on
    # a busy machine can take many times longer than the others.
    "threads": replace(
        FIXED,
        name="threads",
        title="(e) threads per process: (a)'s texts, 2048 of them (64 steps)",
        train_size=2048,
        runners=("project", "project-1proc-1thread", "project-1proc-cores"),
    ),
    "causal": Workload(
        name="causal",
        title="(c) causal LM, packed blocks",
        model_type="causal-lm",
        metric="eval_perplexity",
        higher_is_better=False,
        train_size=9000,
        val_size=200,
        epochs=1,
        words=(0, 0),
        mentions=0,
        max_length=128,
        batch_size=8,
        lr=2e-3,
    ),
    # A short fine-tune, start to end: a MiniLM-L6-sized BERT (all-MiniLM-L6-v2's shape and vocabulary),
    # 384 of (a)'s fixed-length texts, 12 steps. Its wall time is mostly start-up and shut-down, which
    # every user pays per job, and fixed lengths leave length grouping nothing to win.
    "short": replace(
        FIXED,
        name="short",
        title="(g) a short job start to end: 12 steps of a MiniLM-L6-sized BERT",
        train_size=384,
        val_size=128,
        epochs=1,
        eval_every_steps=0,
        log_every_steps=4,
        hidden=384,
        layers=6,
        vocab_size=30522,
        runners=("project", "plain"),
        seeds_per_round=2,  # its target is a median of paired rounds: 6 pairs in 3 rounds
    ),
    # The reference SFT stack against the project: LoRA on a causal LM, loss on the completions only.
    "sft": Workload(
        name="sft",
        title="(f) LoRA instruction tuning of a causal LM: prompt/completion, loss on the completions",
        model_type="causal-lm",
        metric="eval_loss",
        higher_is_better=False,
        train_size=4096,
        val_size=256,
        epochs=1,
        words=(0, 0),
        mentions=0,
        max_length=128,
        batch_size=8,
        lr=2e-2,  # at 5e-2 both stacks' losses spiked and plateaued: 8 seeds gave a spread, not a ranking
        eval_every_steps=16,
        runners=("project", "trainer", "project-grouped"),
        reference="trainer",
        instructions=True,
        lora=LORA,
        seeds_per_round=2,  # its loss target is a median over seeds: 6 in 3 rounds
    ),
    # Token classification (NER): variable-length sentences of one-token filler words with 1-3 entities
    # whose words split into several tokens; the tag of each word on its first token.
    "tagging": Workload(
        name="tagging",
        title="(h) token classification: NER tags on sentences of 4 to 60 words",
        model_type="token-classification",
        metric="eval_f1",
        train_size=4096,
        val_size=512,
        epochs=1,
        words=(4, 60),
        mentions=0,
        max_length=128,
        runners=("project", "plain", "trainer"),
    ),
    # Sequence to sequence: the seq2seq demo's tiny BART on its sentence/gist pairs, loss per target token.
    # Every runner evaluates the loss only (the project with eval.generation_metrics=false): steps and
    # evaluations do the same work in each.
    "seq2seq": Workload(
        name="seq2seq",
        title="(i) sequence to sequence: a tiny BART, the loss over every target token",
        model_type="seq2seq",
        metric="eval_loss",
        higher_is_better=False,
        train_size=4096,
        val_size=256,
        epochs=1,
        words=(0, 0),
        mentions=0,
        max_length=64,
        lr=5e-3,
        runners=("project", "plain", "trainer"),
    ),
}
WORLD_SIZE = 2  # processes of every run but the one-process rows, which keep the global batch
SEED = 42  # of the data; the training seed is SEED + round, the same for every runner of a round
WARMUP_RATIO = 0.06
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0
EVAL_BATCH_SIZE = 32


def global_batch(workload: Workload) -> int:
    return workload.batch_size * WORLD_SIZE


def quick(workload: Workload) -> Workload:
    """A few steps of the same workload: for the bench's own smoke test, not for numbers."""
    return replace(
        workload,
        train_size=256,
        val_size=64,
        epochs=1,
        eval_every_steps=4 if workload.eval_every_steps else 0,
        log_every_steps=2,
        seeds_per_round=1,
        pretraining_steps=2,  # a base model that knows nothing still runs every runner's code
    )


def build_inputs(workload: Workload, directory: Path, project: Path) -> dict[str, str]:
    """Checkpoint and data of the workload under ``directory``, its tokenizer and model built by the
    rendered ``project``'s demo: {model, train_file, val_file}."""
    directory.mkdir(parents=True, exist_ok=True)
    assets.quiet()
    demo = assets.demo_module(project)
    size = {"hidden": workload.hidden, "layers": workload.layers, "context": workload.max_length}
    if workload.model_type == "seq2seq":
        return assets.build_seq2seq(directory, demo, size, workload.train_size, workload.val_size, SEED)
    if workload.model_type == "causal-lm":
        if workload.instructions:
            splits = (workload.train_size, workload.val_size)
            return assets.build_instructions(directory, demo, size, *splits, SEED, workload.pretraining_steps)
        return assets.build_causal(directory, demo, size, workload.train_size, workload.val_size, SEED)
    if workload.model_type == "token-classification":
        size = {"hidden": workload.hidden, "layers": workload.layers, "context": workload.max_length}
        return assets.build_tagging(directory, demo, size, workload.train_size, workload.val_size, SEED)
    model = assets.build_classifier(
        directory / "model", demo, workload.hidden, workload.layers, 256, workload.vocab_size
    )
    train, val = assets.build_classification_data(
        directory, workload.train_size, workload.val_size, workload.words, workload.mentions, SEED
    )
    return {"model": str(model), "train_file": str(train), "val_file": str(val)}


def training_samples(workload: Workload, inputs: dict[str, str]) -> tuple[int, float]:
    """(samples, mean real tokens per sample) of the training set, as every runner tokenizes it."""
    tokenizer = AutoTokenizer.from_pretrained(inputs["model"])
    rows = [json.loads(line) for line in Path(inputs["train_file"]).read_text().splitlines()]
    if workload.instructions:  # each pair one sample: prompt, completion, end-of-text token
        prompts = tokenizer([row["prompt"] for row in rows])["input_ids"]
        answers = tokenizer([row["completion"] for row in rows], add_special_tokens=False)["input_ids"]
        tokens = [len(p) + len(a) + 1 for p, a in zip(prompts, answers, strict=True)]
        return len(tokens), sum(tokens) / len(tokens)
    if workload.model_type == "token-classification":
        words = [row["tokens"] for row in rows]
        ids = tokenizer(words, is_split_into_words=True, truncation=True, max_length=workload.max_length)
        return len(words), sum(map(len, ids["input_ids"])) / len(words)
    if workload.model_type == "seq2seq":  # source and target tokens, each with the tokenizer's specials
        sources, targets = (
            tokenizer([row[key] for row in rows])["input_ids"] for key in ("source", "target")
        )
        tokens = [len(source) + len(target) for source, target in zip(sources, targets, strict=True)]
        return len(tokens), sum(tokens) / len(tokens)
    texts = [row["text"] for row in rows]
    if workload.model_type == "causal-lm":
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        stream = sum(len(document) + 1 for document in ids)  # each document and its end token
        size = workload.max_length
        return (stream - size) // (size - 1) + 1, float(size)
    ids = tokenizer(texts, truncation=True, max_length=workload.max_length)["input_ids"]
    return len(ids), sum(map(len, ids)) / len(ids)


def runner_spec(
    workload: Workload, inputs: dict[str, str], precision: str, seed: int, timeline: Path, batch_size: int
) -> dict[str, Any]:
    """What a hand-written runner reads: the same settings the project gets as overrides."""
    return {
        "task": workload.model_type,
        **inputs,
        "max_length": workload.max_length,
        "batch_size": batch_size,
        "eval_batch_size": EVAL_BATCH_SIZE,
        "epochs": workload.epochs,
        "lr": workload.lr,
        "warmup_ratio": WARMUP_RATIO,
        "weight_decay": WEIGHT_DECAY,
        "max_grad_norm": MAX_GRAD_NORM,
        "precision": precision,
        "eval_every_steps": workload.eval_every_steps,
        "seed": seed,
        "timeline": str(timeline),
        "instructions": workload.instructions,
        "lora": dict(workload.lora),
    }


def project_overrides(
    workload: Workload, inputs: dict[str, str], precision: str, seed: int, output: Path, batch_size: int
) -> list[str]:
    """The same settings as key=value overrides of the generated project; the rest are its defaults."""
    return [
        f"model.pretrained={inputs['model']}",
        f"data.train_file={inputs['train_file']}",
        f"data.val_file={inputs['val_file']}",
        f"data.max_length={workload.max_length}",
        f"data.batch_size={batch_size}",
        f"data.eval_batch_size={EVAL_BATCH_SIZE}",
        f"train.epochs={workload.epochs}",
        f"train.lr={workload.lr}",
        f"train.warmup_ratio={WARMUP_RATIO}",
        f"train.weight_decay={WEIGHT_DECAY}",
        f"train.max_grad_norm={MAX_GRAD_NORM}",
        f"train.precision={precision}",
        f"train.eval_every_steps={workload.eval_every_steps}",
        f"train.log_every_steps={workload.log_every_steps}",
        f"seed={seed}",
        f"output_dir={output}",
        *[f"lora.{key}={value}" for key, value in workload.lora],
        *(["eval.generation_metrics=false"] if workload.model_type == "seq2seq" else []),
    ]
