"""The transformers Trainer with its documented defaults (DataCollatorWithPadding, compute_metrics), on
the same work. ``torchrun ... hf_trainer.py spec.json``; with "grouped" in the spec, its opt-in
``train_sampling_strategy="group_by_length"``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import common
import numpy as np
from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments


class Timing(TrainerCallback):
    def __init__(self, timeline: common.Timeline) -> None:
        self.timeline = timeline

    def on_step_end(self, args, state, control, **kwargs):
        self.timeline.step_done(state.global_step)
        self.timeline.eval_start()  # an evaluation, when one is due, starts right after the step

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        keys = ("eval_loss", "eval_accuracy", "eval_perplexity")
        self.timeline.eval_done(state.global_step, {key: metrics[key] for key in keys if key in metrics})


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def main() -> None:
    spec = common.load_spec()
    tokenizer, train, val, labels = common.load_data(spec)
    causal = spec["task"] == "causal-lm"
    every = spec["eval_every_steps"]
    arguments = TrainingArguments(
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
        eval_strategy="steps" if every else "epoch",  # every `every` steps, the epochs' ends among them
        eval_steps=every or None,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
        prediction_loss_only=causal,
        train_sampling_strategy="group_by_length" if spec.get("grouped") else "random",
    )
    timeline = common.Timeline(spec)
    trainer = Trainer(
        model=common.build_model(spec, labels),
        args=arguments,
        train_dataset=train,
        eval_dataset=val,
        data_collator=common.PadToLongest(tokenizer.pad_token_id, True)
        if causal
        else DataCollatorWithPadding(tokenizer),
        compute_metrics=None if causal else accuracy,
        callbacks=[Timing(timeline)],
    )
    trainer.train()
    for record in timeline.evals:
        if causal:
            record["eval_perplexity"] = float(np.exp(min(record["eval_loss"], 700.0)))
    timeline.write()
    del trainer  # the DDP wrapper goes before the process group it uses
    common.finish()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
