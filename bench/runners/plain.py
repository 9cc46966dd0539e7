"""The reference: a hand-written best-practice DDP loop (PyTorch's DDP tutorial plus AMP, clipping and a
schedule), on the same work as the generated project. ``torchrun ... plain.py spec.json``."""

from __future__ import annotations

import os
from functools import partial

import common
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset


def main() -> None:
    spec = common.load_spec()
    dist.init_process_group("gloo")
    fit(spec)
    common.finish()


def fit(spec: dict) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    common.seed_all(spec["seed"])
    tokenizer, train, val, labels = common.load_data(spec)
    collate = common.collator(spec, tokenizer)
    sampler = DistributedSampler(train, shuffle=True, seed=spec["seed"], drop_last=True)
    loader = DataLoader(train, batch_size=spec["batch_size"], sampler=sampler, collate_fn=collate)
    val_loader = DataLoader(
        Subset(val, common.eval_shard(len(val), rank, world_size)),
        batch_size=spec["eval_batch_size"],
        collate_fn=collate,
    )
    model = DistributedDataParallel(common.build_model(spec, labels))
    optimizer = torch.optim.AdamW(common.param_groups(model.module, spec["weight_decay"]), lr=spec["lr"])
    total_steps = len(loader) * spec["epochs"]
    scheduler = common.warmup_then_linear_decay(optimizer, total_steps, spec["warmup_ratio"])
    timeline, step = common.Timeline(spec, len(loader)), 0
    for epoch in range(spec["epochs"]):
        sampler.set_epoch(epoch)
        model.train()
        for batch in loader:
            with common.autocast(spec):
                loss = common.training_loss(model, batch, spec["task"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["max_grad_norm"])
            common.optimizer_step(optimizer, scheduler)
            step += 1
            timeline.step_done(step, partial(evaluate, model, val_loader, spec))
    timeline.write()


def evaluate(model: DistributedDataParallel, loader: DataLoader, spec: dict) -> dict[str, float]:
    sums = common.local_sums(model.module, loader, spec)  # the bare module: no DDP sync in evaluation
    dist.all_reduce(sums)
    model.train()
    return common.metrics_from_sums(sums.tolist(), spec["task"])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
