"""Hugging Face Accelerate, as its documentation writes the loop (prepare, backward, clip_grad_norm_,
gather_for_metrics), on the same work. ``torchrun ... accelerate_loop.py spec.json``."""

from __future__ import annotations

import os
from functools import partial

import common
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader


def main() -> None:
    spec = common.load_spec()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16" if spec["precision"] == "bf16" else "no")
    common.seed_all(spec["seed"])
    tokenizer, train, val, labels = common.load_data(spec)
    collate = common.PadToLongest(tokenizer.pad_token_id, spec["task"] == "causal-lm")
    loader = DataLoader(
        train, batch_size=spec["batch_size"], shuffle=True, drop_last=True, collate_fn=collate
    )
    val_loader = DataLoader(val, batch_size=spec["eval_batch_size"], collate_fn=collate)
    model = common.build_model(spec, labels)
    optimizer = torch.optim.AdamW(common.param_groups(model, spec["weight_decay"]), lr=spec["lr"])
    # Accelerate steps a prepared scheduler once per process per step: size it for the unsharded loader.
    scheduler = common.warmup_then_linear_decay(optimizer, len(loader) * spec["epochs"], spec["warmup_ratio"])
    model, optimizer, loader, val_loader, scheduler = accelerator.prepare(
        model, optimizer, loader, val_loader, scheduler
    )
    timeline, step = common.Timeline(spec, len(loader)), 0
    for _epoch in range(spec["epochs"]):
        model.train()
        for batch in loader:
            loss = common.training_loss(model, batch, spec["task"])
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), spec["max_grad_norm"])
            common.optimizer_step(optimizer, scheduler)
            step += 1
            timeline.step_done(step, partial(evaluate, accelerator, model, val_loader, spec))
    timeline.write()
    del model, optimizer, loader, val_loader, scheduler
    accelerator.free_memory()  # its references to the DDP wrapper, before end_training's group teardown
    accelerator.end_training()
    common.finish()


def evaluate(accelerator: Accelerator, model, loader: DataLoader, spec: dict) -> dict[str, float]:
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    for batch in loader:
        rows = common.evaluation_rows(model, batch, spec["task"])
        # gather_for_metrics drops the samples the sharded loader repeats to even out the last batch.
        totals += accelerator.gather_for_metrics(rows).sum(dim=0)
    model.train()
    return common.metrics_from_sums(totals.tolist(), spec["task"])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
