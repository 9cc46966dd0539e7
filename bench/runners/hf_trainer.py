"""The transformers Trainer with its documented defaults (DataCollatorWithPadding, compute_metrics), on
the same work. ``torchrun ... hf_trainer.py spec.json``; with "grouped" in the spec, its opt-in
``train_sampling_strategy="group_by_length"``. With "lora", peft's adapters on the model (the reference
SFT stack); on instruction data it is evaluated by the shared exact sums (the loss over every completion
token), since the Trainer's own eval_loss averages per-batch means. On seq2seq pairs: Seq2SeqTrainer
with DataCollatorForSeq2Seq, the loss alone (no generation, as the other runners)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import common
import numpy as np
import tagging
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset
from transformers import (
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Timing(TrainerCallback):
    """Each step's end; with ``exact`` (a loader of this rank's validation shard), the evaluation too."""

    def __init__(self, timeline: common.Timeline, spec: dict, exact: DataLoader | None = None) -> None:
        self.timeline, self.spec, self.exact = timeline, spec, exact

    def on_step_end(self, args, state, control, **kwargs):
        if self.exact is None:
            self.timeline.step_done(state.global_step)
            self.timeline.eval_start()  # an evaluation, when one is due, starts right after the step
            return
        due = state.global_step % self.spec["eval_every_steps"] == 0 or state.global_step == state.max_steps
        self.timeline.step_done(state.global_step)
        if due:
            self.timeline.eval_start()
            self.timeline.eval_done(state.global_step, self.evaluate(kwargs["model"]))

    def evaluate(self, model) -> dict[str, float]:
        sums = common.local_sums(model, self.exact, self.spec)
        dist.all_reduce(sums)
        model.train()
        return common.metrics_from_sums(sums.tolist(), self.spec["task"])

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        keys = ("eval_loss", "eval_accuracy", "eval_perplexity", "eval_precision", "eval_recall", "eval_f1")
        self.timeline.eval_done(state.global_step, {key: metrics[key] for key in keys if key in metrics})


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def collator(spec: dict, tokenizer, model):
    if spec["task"] == "seq2seq":  # pads the labels with -100
        return DataCollatorForSeq2Seq(tokenizer, model=model)
    if spec["task"] == "causal-lm":
        return common.PadToLongest(tokenizer.pad_token_id, True)
    if spec["task"] == "token-classification":  # pads the labels with -100
        return DataCollatorForTokenClassification(tokenizer)
    return DataCollatorWithPadding(tokenizer)


def metrics(spec: dict):
    if spec["task"] == "token-classification":
        return tagging.trainer_metrics(tagging.tag_names(common.read_jsonl(spec["train_file"])))
    return accuracy


def main() -> None:
    spec = common.load_spec()
    tokenizer, train, val, labels = common.load_data(spec)
    causal = spec["task"] == "causal-lm"
    seq2seq = spec["task"] == "seq2seq"
    every = spec["eval_every_steps"]
    exact = None
    if spec.get("instructions"):  # evaluated by Timing, on this rank's shard
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        shard = Subset(val, common.eval_shard(len(val), rank, world_size))
        collate = common.PadToLongest(tokenizer.pad_token_id, True)
        exact = DataLoader(shard, batch_size=spec["eval_batch_size"], collate_fn=collate)
    arguments = (Seq2SeqTrainingArguments if seq2seq else TrainingArguments)(
        output_dir=str(Path(sys.argv[1]).parent / "trainer-output"),  # saves nothing, in the run directory
        per_device_train_batch_size=spec["batch_size"],
        per_device_eval_batch_size=spec["eval_batch_size"],
        learning_rate=spec["lr"],
        num_train_epochs=spec["epochs"],
        warmup_steps=spec["warmup_ratio"],
        weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"],
        bf16=spec["precision"] == "bf16",
        use_cpu=True,
        ddp_backend="gloo",
        # every `every` steps, the epochs' ends among them (Timing's own evaluation on instruction data)
        eval_strategy="no" if exact is not None else "steps" if every else "epoch",
        eval_steps=every or None,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
        prediction_loss_only=causal or seq2seq,
        train_sampling_strategy="group_by_length" if spec.get("grouped") else "random",
    )
    timeline = common.Timeline(spec)
    # As transformers' examples do (set_seed before from_pretrained): the new head or LoRA adapters are
    # drawn from the run's seed, as the project's are, not from torch's default seed in every round.
    common.seed_all(spec["seed"])
    model = common.build_model(spec, labels)
    trainer = (Seq2SeqTrainer if seq2seq else Trainer)(
        model=model,
        args=arguments,
        train_dataset=train,
        eval_dataset=val,
        data_collator=collator(spec, tokenizer, model),
        compute_metrics=None if causal or seq2seq else metrics(spec),
        callbacks=[Timing(timeline, spec, exact)],
    )
    trainer.train()
    for record in timeline.evals:
        if (causal or seq2seq) and exact is None:
            record["eval_perplexity"] = float(np.exp(min(record["eval_loss"], 700.0)))
    timeline.write()
    del trainer  # the DDP wrapper goes before the process group it uses
    common.finish()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
