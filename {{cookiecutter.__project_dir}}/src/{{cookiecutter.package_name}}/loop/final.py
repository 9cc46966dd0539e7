"""The end of a run: ``final/``, the fine-tuned model alone, replaced as a whole so it is never
half-written."""

from __future__ import annotations

import shutil
from pathlib import Path

from torch import nn

from ..observe.log import log
from ..parallel.process_group import DistEnv, barrier
from ..parallel.strategy import Parallel
from ..task.lora import save_final
from ..task.spec import Task, TaskData


def write_final(
    output_dir: Path, model: nn.Module, parallel: Parallel, task: Task, data: TaskData, env: DistEnv
) -> None:
    with parallel.full_model(model) as module:  # gathered on rank 0 under FSDP2
        if module is not None and env.is_main:
            final = output_dir / "final"
            partial = output_dir / ".final.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            save_final(task, module, data, partial)  # LoRA: merged, and the adapter
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            log.info(f"fine-tuned model saved: {final}")
    barrier()  # no rank reports success before the model is on disk
