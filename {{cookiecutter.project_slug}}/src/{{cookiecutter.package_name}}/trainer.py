"""The training loop: accumulation with ``no_sync``, mixed precision, clipping, evaluation, checkpoints."""

from __future__ import annotations

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
from .data import (
    DataError,
    EvalBatches,
    ResumableDistributedSampler,
    count_samples,
    make_loader,
    to_device,
)
from .distributed import DistEnv, all_reduce_sum, barrier, gather_objects, main_process_first
from .evaluation import evaluate
from .metrics import MetricsWriter, log
from .model import compile_model, parameter_checksums, skip_gradient_sync, unwrap, wrap_ddp
from .optim import build_optimizer, build_scheduler
from .precision import autocast, effective_precision, fallback_warning, grad_scaler
from .preemption import Preempted, PreemptionWatch
from .rng import seed_everything
from .throughput import Throughput, device_peak_flops, training_flops_per_token
from .trackers import open_tracker


class Trainer:
    def __init__(
        self, config: Config, task: ModuleType, env: DistEnv, preemption: PreemptionWatch | None = None
    ) -> None:
        self.config, self.task, self.env = config, task, env
        self.preemption = preemption or PreemptionWatch()
        self.output_dir = Path(config.output_dir)
        if env.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")

        # One seed for data and model set-up, so every rank (and every world size) builds the same head.
        seed_everything(config.seed)
        self.data = task.build_data(config, env)
        with _download_first(config.model.pretrained, env):
            model = task.build_model(config, self.data).to(env.device)

        train, grouped = config.train, config.data.group_by_length
        self.precision = effective_precision(train.precision, env.device)
        if self.precision is not train.precision and env.is_main:
            log.warning(fallback_warning(env.device))
        global_batch = config.data.batch_size * env.world_size * train.grad_accum_steps
        self.sampler = ResumableDistributedSampler(
            self.data.train,
            env,
            config.seed,
            global_batch=global_batch,
            lengths=self.data.train_lengths if grouped else None,
        )
        if not self.sampler.total_size:
            raise DataError(
                f"the training set has {len(self.data.train)} samples, fewer than one global batch of "
                f"{global_batch} (data.batch_size x {env.world_size} process(es) x train.grad_accum_steps); "
                "lower data.batch_size or train.grad_accum_steps, or add training data"
            )
        self.train_loader = make_loader(
            self.data.train, self.data, config, env, sampler=self.sampler, batch_size=config.data.batch_size
        )
        self.val_loader = None
        if self.data.val is not None:
            eval_batches = EvalBatches(
                len(self.data.val),
                config.data.eval_batch_size,
                env,
                lengths=self.data.val_lengths if grouped else None,
            )
            self.val_loader = make_loader(self.data.val, self.data, config, env, batch_sampler=eval_batches)
        self.steps_per_epoch = self.sampler.num_samples // (config.data.batch_size * train.grad_accum_steps)
        self.total_steps = self.steps_per_epoch * train.epochs
        if train.max_steps:
            self.total_steps = min(self.total_steps, train.max_steps)

        self.optimizer = build_optimizer(model, train, env.device)
        self.scheduler = build_scheduler(self.optimizer, train, self.total_steps)
        self.scaler = grad_scaler(self.precision, env.device)
        self.checkpointer = Checkpointer(self.output_dir / "checkpoints", env, config.checkpoint.keep_last)
        resumed = self.checkpointer.load_latest(
            model, self.optimizer, self.scheduler, self.scaler, config.seed
        )
        self.metrics = MetricsWriter(
            self.output_dir, env, open_tracker(config, env, resumed.step if resumed else None)
        )
        if resumed is None:
            seed_everything(config.seed + env.rank)  # dropout etc. differ by rank, as they should
        else:
            self.metrics.resume_from(resumed.step)
        self.state = resumed or TrainState()
        self.model = wrap_ddp(model, env, config.distributed)
        if train.compile:
            self.model = compile_model(self.model)
        self.peak_flops = device_peak_flops(env.device, self.precision, train.peak_tflops)
        self.flops_per_token = training_flops_per_token(model) if self.peak_flops else 0.0
        self.last_eval: dict[str, float] = {}
        self.throughput = Throughput()
        self.bar = tqdm(disable=True)  # replaced by fit()'s progress bar

    def fit(self) -> dict[str, float]:
        """Train to the end (or ``train.max_steps``), save ``final/``, return the last eval metrics."""
        log.info(
            f"training {self.total_steps} steps on {self.env.world_size} process(es), "
            f"{self.config.data.batch_size} samples per process per micro-step, "
            f"{self.config.train.grad_accum_steps} micro-step(s) per step"
        )
        left_out = len(self.sampler.dataset) - self.sampler.total_size
        if left_out:
            log.info(
                f"each epoch trains on {self.sampler.total_size} of {len(self.sampler.dataset)} samples, "
                f"whole global batches; a different {left_out} sit out each epoch"
            )
        outcome = "failed"
        try:
            self.train_to_the_end()
            if self.val_loader is not None and self.last_eval.get("step") != self.state.step:
                self.evaluate()
            self.verify_replicas()
            self.save_final()
            outcome = "finished"
        except Preempted:
            outcome = "preempted"
            raise
        finally:
            self.metrics.close(outcome)
        return self.last_eval

    def train_to_the_end(self) -> None:
        """Rank 0 shows a progress bar on a terminal: steps, ETA and the last logged loss, lr, samples/s."""
        show_bar = self.env.is_main and sys.stderr.isatty()
        with (
            logging_redirect_tqdm(loggers=[log]),
            tqdm(
                total=self.total_steps, initial=self.state.step, disable=not show_bar, unit="step"
            ) as self.bar,
        ):
            self.throughput = Throughput(self.flops_per_token, self.peak_flops)
            while not self.finished():
                self.run_epoch()
            self.preemption.settle()

    def finished(self) -> bool:
        return self.state.step >= self.total_steps or self.state.epoch >= self.config.train.epochs

    def run_epoch(self) -> None:
        state, batch_size = self.state, self.config.data.batch_size
        self.sampler.set_epoch(state.epoch)
        self.sampler.start_at(state.epoch_samples)
        self.train_loader.generator = torch.Generator().manual_seed(self.config.seed + state.epoch)
        batches = iter(self.train_loader)
        remaining_samples = len(self.sampler)  # this rank's, equal on every rank
        self.model.train()
        while remaining_samples and state.step < self.total_steps:
            window_samples = min(self.config.train.grad_accum_steps * batch_size, remaining_samples)
            loss = self.optimizer_step(batches, window_samples)
            remaining_samples -= window_samples
            state.step += 1
            state.epoch_samples += window_samples * self.env.world_size
            self.bar.update(1)
            self.after_step(loss, epoch_done=remaining_samples == 0)
            if self.preemption.agreed():
                self.checkpointer.save(state, self.model, self.optimizer, self.scheduler, self.scaler)
                # No rank exits before the checkpoint is on disk: schedulers stop a whole job when its
                # first node exits (srun --kill-on-bad-exit, a PyTorchJob restarting its pods).
                barrier()
                raise Preempted(self.preemption.signal_name(), state.step)

    def optimizer_step(self, batches: Iterator, window_samples: int) -> torch.Tensor:
        """One optimizer step over the micro-batches holding ``window_samples`` samples.

        Each micro-batch's mean loss is weighted by its share of the window's samples, so the gradient is
        that of the mean over the whole window.
        Gradients are all-reduced once, on the last micro-batch.
        """
        train, total_loss, done = self.config.train, torch.zeros((), device=self.env.device), 0
        while done < window_samples:
            with self.throughput.waiting_for_data():
                host_batch = next(batches)
            samples = count_samples(host_batch)
            self.throughput.add(samples * self.env.world_size, self.data.count_tokens(host_batch))
            batch = to_device(host_batch, self.env.device)
            done += samples
            with skip_gradient_sync(self.model, done < window_samples):
                with autocast(self.precision, self.env.device):
                    loss = self.task.training_loss(self.model, batch) * (samples / window_samples)
                self.scaler.scale(loss).backward()
            total_loss += loss.detach().float()
        if train.max_grad_norm:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total_loss

    def after_step(self, loss: torch.Tensor, epoch_done: bool) -> None:
        state, train = self.state, self.config.train
        last_step = state.step >= self.total_steps
        # The first step is logged too: its loss is the sanity check, and its time the start-up's cost.
        if state.step % train.log_every_steps == 0 or state.step == 1 or last_step or epoch_done:
            self.log_training(loss)
        if epoch_done:
            state.epoch += 1
            state.epoch_samples = 0
        evaluate_now = train.eval_every_steps and state.step % train.eval_every_steps == 0
        every = self.config.checkpoint.every_steps
        with self.throughput.paused():
            if self.val_loader is not None and (evaluate_now or epoch_done or last_step):
                self.evaluate()
            if (every and state.step % every == 0) or epoch_done or last_step:
                self.checkpointer.save(state, self.model, self.optimizer, self.scheduler, self.scaler)

    def log_training(self, loss: torch.Tensor) -> None:
        """The only host synchronisation of the loop: every ``train.log_every_steps`` steps, one all-reduce
        of the loss and every rank's token and data-wait counts."""
        world_size = self.env.world_size
        counts = torch.tensor(self.throughput.local_counts(), dtype=torch.float64, device=self.env.device)
        loss_sum, tokens, waited = all_reduce_sum(torch.cat([loss.double().view(1), counts])).tolist()
        mean_loss, lr = loss_sum / world_size, self.scheduler.get_last_lr()[0]
        speed = self.throughput.read(tokens=tokens, waited=waited, world_size=world_size)
        record = {"step": self.state.step, "epoch": self.epoch_progress(), "loss": mean_loss, "lr": lr}
        self.metrics.write({**record, **speed})
        self.bar.set_postfix(
            loss=f"{mean_loss:.4g}", lr=f"{lr:.3g}", samples_s=f"{speed['samples_per_s']:.1f}"
        )

    def epoch_progress(self) -> float:
        per_epoch = self.sampler.num_samples * self.env.world_size
        return round(self.state.epoch + self.state.epoch_samples / per_epoch, 4)

    def evaluate(self) -> None:
        assert self.val_loader is not None
        results = evaluate(self.model, self.val_loader, self.task, self.env, self.precision)
        self.last_eval = {"step": self.state.step, "epoch": self.epoch_progress(), **results}
        self.metrics.write(self.last_eval)

    def verify_replicas(self) -> None:
        """DDP keeps replicas identical by construction; prove it before saving one of them."""
        checksums = gather_objects(parameter_checksums(self.model), self.env)
        for rank, theirs in enumerate(checksums):
            differing = [mine[0] for mine, other in zip(checksums[0], theirs, strict=True) if mine != other]
            if differing:
                raise RuntimeError(f"rank {rank} holds different values of {differing[0]} than rank 0")
        log.info(f"parameters identical on all {self.env.world_size} rank(s)")

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
