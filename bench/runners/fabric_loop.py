"""Lightning Fabric, as its documentation writes the loop (setup, setup_dataloaders, backward,
clip_gradients), on the same work. ``torchrun ... fabric_loop.py spec.json``."""

from __future__ import annotations

import os
from functools import partial

import common
import torch
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy
from torch.utils.data import DataLoader, Subset


def main() -> None:
    spec = common.load_spec()
    fabric = Fabric(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy=DDPStrategy(process_group_backend="gloo"),
        precision="bf16-mixed" if spec["precision"] == "bf16" else "32-true",
    )
    fabric.launch()
    fabric.seed_everything(spec["seed"], verbose=False)
    tokenizer, train, val, labels = common.load_data(spec)
    collate = common.PadToLongest(tokenizer.pad_token_id, spec["task"] == "causal-lm")
    # setup_dataloaders puts in a DistributedSampler and sets its epoch on every pass.
    loader = fabric.setup_dataloaders(
        DataLoader(train, batch_size=spec["batch_size"], shuffle=True, drop_last=True, collate_fn=collate)
    )
    val_loader = DataLoader(
        Subset(val, common.eval_shard(len(val), fabric.global_rank, fabric.world_size)),
        batch_size=spec["eval_batch_size"],
        collate_fn=collate,
    )
    model = common.build_model(spec, labels)
    optimizer = torch.optim.AdamW(common.param_groups(model, spec["weight_decay"]), lr=spec["lr"])
    model, optimizer = fabric.setup(model, optimizer)
    total_steps = len(loader) * spec["epochs"]
    scheduler = common.warmup_then_linear_decay(optimizer, total_steps, spec["warmup_ratio"])
    timeline, step = common.Timeline(spec, len(loader)), 0
    for _epoch in range(spec["epochs"]):
        model.train()
        for batch in loader:
            loss = common.training_loss(model, batch, spec["task"])
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, max_norm=spec["max_grad_norm"])
            common.optimizer_step(optimizer, scheduler)
            step += 1
            timeline.step_done(step, partial(evaluate, fabric, model, val_loader, spec))
    timeline.write()
    del model, optimizer
    common.finish()


def evaluate(fabric: Fabric, model, loader: DataLoader, spec: dict) -> dict[str, float]:
    sums = fabric.all_reduce(common.local_sums(model, loader, spec), reduce_op="sum")
    model.train()
    return common.metrics_from_sums(sums.tolist(), spec["task"])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
