"""The training loop: accumulation with ``no_sync``, mixed precision, clipping, evaluation, checkpoints."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import ModuleType

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .checkpoint import Checkpointer, TrainState
from .config import Config
from .data import ResumableDistributedSampler, ShardSampler, make_loader, to_device
from .distributed import DistEnv, all_reduce_sum, barrier, main_process_first
from .evaluation import evaluate
from .metrics import MetricsWriter, log
from .model import skip_gradient_sync, unwrap, wrap_ddp
from .optim import build_optimizer, build_scheduler
from .precision import autocast, grad_scaler
from .rng import seed_everything


class Trainer:
    def __init__(self, config: Config, task: ModuleType, env: DistEnv) -> None:
        self.config, self.task, self.env = config, task, env
        self.output_dir = Path(config.output_dir)
        self.metrics = MetricsWriter(self.output_dir, env)
        if env.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")

        # One seed for data and model set-up, so every rank (and every world size) builds the same head.
        seed_everything(config.seed)
        self.data = task.build_data(config, env)
        with _download_first(config.model.pretrained, env):
            model = task.build_model(config, self.data).to(env.device)

        train = config.train
        self.sampler = ResumableDistributedSampler(self.data.train, env, config.seed)
        self.train_loader = make_loader(
            self.data.train, self.sampler, config.data.batch_size, self.data, config, env
        )
        self.val_loader = None
        if self.data.val is not None:
            shard = ShardSampler(len(self.data.val), env)
            self.val_loader = make_loader(
                self.data.val, shard, config.data.eval_batch_size, self.data, config, env
            )
        batches = math.ceil(self.sampler.num_samples / config.data.batch_size)
        self.steps_per_epoch = math.ceil(batches / train.grad_accum_steps)
        self.total_steps = self.steps_per_epoch * train.epochs
        if train.max_steps:
            self.total_steps = min(self.total_steps, train.max_steps)

        self.optimizer = build_optimizer(model, train, env.device)
        self.scheduler = build_scheduler(self.optimizer, train, self.total_steps)
        self.scaler = grad_scaler(train.precision, env.device)
        self.checkpointer = Checkpointer(self.output_dir / "checkpoints", env, config.checkpoint.keep_last)
        resumed = self.checkpointer.load_latest(
            model, self.optimizer, self.scheduler, self.scaler, config.seed
        )
        if resumed is None:
            seed_everything(config.seed + env.rank)  # dropout etc. differ by rank, as they should
        else:
            self.metrics.resume_from(resumed.step)
        self.state = resumed or TrainState()
        self.model = wrap_ddp(model, env, config.distributed)
        self.last_eval: dict[str, float] = {}

    def fit(self) -> dict[str, float]:
        """Train to the end (or ``train.max_steps``), save ``final/``, return the last eval metrics."""
        log.info(
            f"training {self.total_steps} steps on {self.env.world_size} process(es), "
            f"{self.config.data.batch_size} samples per process per micro-step, "
            f"{self.config.train.grad_accum_steps} micro-step(s) per step"
        )
        show_bar = self.env.is_main and sys.stderr.isatty()
        with (
            logging_redirect_tqdm(loggers=[log]),
            tqdm(total=self.total_steps, initial=self.state.step, disable=not show_bar) as bar,
        ):
            while not self.finished():
                self.run_epoch(bar)
        if self.val_loader is not None and self.last_eval.get("step") != self.state.step:
            self.evaluate()
        self.save_final()
        return self.last_eval

    def finished(self) -> bool:
        return self.state.step >= self.total_steps or self.state.epoch >= self.config.train.epochs

    def run_epoch(self, bar: tqdm) -> None:
        state = self.state
        self.sampler.set_epoch(state.epoch)
        self.sampler.start_at(state.epoch_samples)
        self.train_loader.generator = torch.Generator().manual_seed(self.config.seed + state.epoch)
        batches = iter(self.train_loader)
        remaining = len(self.train_loader)
        self.model.train()
        while remaining and state.step < self.total_steps:
            window = min(self.config.train.grad_accum_steps, remaining)
            loss, samples = self.optimizer_step(batches, window)
            remaining -= window
            state.step += 1
            state.epoch_samples += samples * self.env.world_size
            bar.update(1)
            self.after_step(loss, epoch_done=remaining == 0)

    def optimizer_step(self, batches: Iterator, window: int) -> tuple[torch.Tensor, int]:
        """One optimizer step over ``window`` micro-batches; gradients sync only on the last one."""
        train, total_loss, samples = self.config.train, torch.zeros((), device=self.env.device), 0
        for micro_step in range(window):
            batch = to_device(next(batches), self.env.device)
            samples += len(next(iter(batch.values())))
            with skip_gradient_sync(self.model, micro_step < window - 1):
                with autocast(train.precision, self.env.device):
                    loss = self.task.training_loss(self.model, batch)
                self.scaler.scale(loss / window).backward()
            total_loss += loss.detach().float()
        if train.max_grad_norm:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total_loss / window, samples

    def after_step(self, loss: torch.Tensor, epoch_done: bool) -> None:
        state, train = self.state, self.config.train
        last_step = state.step >= self.total_steps
        if state.step % train.log_every_steps == 0 or last_step or epoch_done:
            mean_loss = all_reduce_sum(loss.clone()).item() / self.env.world_size
            lr = self.scheduler.get_last_lr()[0]
            self.metrics.write(
                {"step": state.step, "epoch": self.epoch_progress(), "loss": mean_loss, "lr": lr}
            )
        if epoch_done:
            state.epoch += 1
            state.epoch_samples = 0
        evaluate_now = train.eval_every_steps and state.step % train.eval_every_steps == 0
        if self.val_loader is not None and (evaluate_now or epoch_done or last_step):
            self.evaluate()
        every = self.config.checkpoint.every_steps
        if (every and state.step % every == 0) or epoch_done or last_step:
            self.checkpointer.save(state, self.model, self.optimizer, self.scheduler, self.scaler)

    def epoch_progress(self) -> float:
        per_epoch = self.sampler.num_samples * self.env.world_size
        return round(self.state.epoch + self.state.epoch_samples / per_epoch, 4)

    def evaluate(self) -> None:
        assert self.val_loader is not None
        results = evaluate(self.model, self.val_loader, self.task, self.env, self.config.train.precision)
        self.last_eval = {"step": self.state.step, "epoch": self.epoch_progress(), **results}
        self.metrics.write(self.last_eval)

    def save_final(self) -> None:
        """``final/``: the fine-tuned model alone, replaced as a whole so it is never half-written."""
        if self.env.is_main:
            final = self.output_dir / "final"
            partial = self.output_dir / ".final.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            self.task.save_final(unwrap(self.model), self.data, partial)
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            log.info(f"fine-tuned model saved: {final}")
        barrier()  # no rank reports success before the model is on disk


def _download_first(pretrained: str, env: DistEnv) -> AbstractContextManager:
    """Rank 0 alone fetches a hub checkpoint, the others then read the cache; local paths load at once."""
    if not pretrained or Path(pretrained).exists():
        return nullcontext()
    return main_process_first(env)
