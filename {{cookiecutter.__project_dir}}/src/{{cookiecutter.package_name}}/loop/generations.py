"""What the model answers now: at each evaluation, greedy completions of the first validation prompts
(``eval.generate_samples``), one JSON line each in ``output_dir/samples.jsonl``, written by rank 0."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..config import Config
from ..observe.metrics import keep_up_to
from ..parallel.ddp import unwrap
from ..parallel.process_group import DistEnv
from ..parallel.strategy import Parallel
from ..task.spec import Task, TaskData


class SampleWriter:
    def __init__(self, output_dir: Path, config: Config, env: DistEnv, resumed_step: int | None) -> None:
        self.path = output_dir / "samples.jsonl"
        self.count, self.max_new_tokens = config.eval.generate_samples, config.eval.max_new_tokens
        self.env = env
        if env.is_main and resumed_step is not None:  # what it wrote after its checkpoint is redone
            keep_up_to(self.path, resumed_step)

    def write(self, model: nn.Module, task: Task, data: TaskData, parallel: Parallel, step: int) -> None:
        """Every rank generates (an FSDP2 forward gathers from all of them); rank 0 writes."""
        if not self.count or task.generate is None or data.val is None:
            return
        # The bare module: DDP's forward would sync; torch.compile would recompile for every length.
        module = unwrap(model)
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad(), parallel.autocast():
                records = task.generate(module, data, self.count, self.max_new_tokens, self.env.device)
        finally:
            module.train(was_training)
        if self.env.is_main:
            with self.path.open("a", encoding="utf-8") as file:
                file.writelines(json.dumps({"step": step, **record}) + "\n" for record in records)
