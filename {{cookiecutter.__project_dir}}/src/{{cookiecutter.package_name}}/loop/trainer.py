"""The training loop: accumulation, mixed precision, clipping, evaluation, checkpoints; one loop for DDP
and FSDP2, whose differences sit behind ``Parallel`` (parallel/strategy.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..config import Config
from ..data.batch_plan import plan_batches
from ..data.loader import to_device
from ..launch.preemption import Preempted, PreemptionWatch
from ..observe.log import log
from ..observe.memory import peak_memory
from ..observe.metrics import MetricsWriter
from ..observe.phases import TRAINING, phases
from ..observe.throughput import Throughput, device_peak_flops, training_flops_per_token
from ..observe.trackers import NoTracker, open_tracker
from ..parallel.checkpoint import Checkpointer
from ..parallel.ddp import compile_model, sync_state_buffers
from ..parallel.process_group import DistEnv, all_reduce_sum, barrier, broadcast_object
from ..parallel.rng import seed_everything
from ..parallel.strategy import build_parallel
from ..task.spec import Task, count_samples, dataset_size
from .checkpoint_clock import CheckpointClock
from .evaluation import evaluate
from .final import write_final
from .generations import SampleWriter
from .longest_batch import try_longest_batch
from .nonfinite import NonFiniteGuard
from .setup import (
    build_training_state,
    download_first,
    prepare_output_dir,
    record_config,
    training_precision,
)
from .step_targets import start_counting_targets


class Trainer:
    def __init__(
        self, config: Config, task: Task, env: DistEnv, preemption: PreemptionWatch | None = None
    ) -> None:
        self.config, self.task, self.env = config, task, env
        self.preemption = preemption or PreemptionWatch()
        self.output_dir = prepare_output_dir(config, env)
        # One seed for data and model set-up, so every rank (and every world size) builds the same head.
        seed_everything(config.seed)
        self.data = task.build_data(config, env)
        self.plan = plan_batches(self.data, config, env)
        phases.mark("data")
        self.precision = training_precision(config.train.precision, env)
        with download_first(config.model.pretrained, env):
            model = task.build_model(config, self.data)
        phases.mark("model")
        self.parallel = build_parallel(config.distributed, env, self.precision)
        self.state = build_training_state(model, config, env, self.plan.total_steps, self.parallel)
        layout, keep_last = self.parallel.checkpoint_layout(config.checkpoint), config.checkpoint.keep_last
        self.checkpointer = Checkpointer(self.output_dir / "checkpoints", env, keep_last, layout)
        self.clock = CheckpointClock(config.checkpoint.every_minutes)
        resumed = self.checkpointer.load_latest(self.state, config.seed)
        if not resumed:
            seed_everything(config.seed + env.rank)  # dropout etc. differ by rank, as they should
        # A rerun of a finished run changes nothing: no record, no tracker run, no config.yaml.
        self.done_before = bool(resumed) and self.finished() and self.final_saved()
        self.last_eval: dict[str, float] = {}
        if self.done_before:
            self.metrics = MetricsWriter(self.output_dir, env, NoTracker(), enabled=False)
            self.last_eval = broadcast_object(self.metrics.evaluation_at(self.state.progress.step), env)
        else:
            record_config(self.output_dir, config, resumed, env)
            tracker = open_tracker(config, env, resumed.step if resumed else None)
            self.metrics = MetricsWriter(self.output_dir, env, tracker)
            if resumed:  # an evaluation of the resumed step already on record is not repeated
                self.last_eval = broadcast_object(self.metrics.resume_from(resumed.step), env)
        self.samples = SampleWriter(self.output_dir, config, env, resumed.step if resumed else None)
        self.nonfinite = NonFiniteGuard(env.device, config.train.lr, clipping=config.train.max_grad_norm > 0)
        if config.train.compile:
            self.state.model = compile_model(self.state.model)
        peak_flops = device_peak_flops(env.device, self.precision, config.train.peak_tflops)
        flops_per_token = training_flops_per_token(model) if peak_flops else 0.0
        self.throughput = Throughput(flops_per_token, peak_flops)
        self.bar = tqdm(disable=True)  # replaced by fit()'s progress bar
        phases.mark("training state")

    def fit(self) -> dict[str, float]:
        """Train to the end (or ``train.max_steps``), save ``final/``, return the last eval metrics."""
        if self.done_before:
            log.info(
                f"{self.output_dir} holds a finished run (step {self.state.progress.step}, final/ saved): "
                "nothing to do; use a new output_dir, or checkpoint.start_over=true to train again"
            )
            return self.last_eval
        plan, data = self.plan, self.config.data
        log.info(
            f"training {plan.total_steps} steps on {self.env.world_size} process(es), "
            f"{data.batch_size} samples per process per micro-step, "
            f"{self.config.train.grad_accum_steps} micro-step(s) per step"
        )
        if plan.left_out:
            log.info(
                f"each epoch trains on {plan.sampler.total_size} of {dataset_size(self.data.train)} samples, "
                f"whole global batches; a different {plan.left_out} sit out each epoch"
            )
        outcome = "failed"
        try:
            try_longest_batch(self.state, self.data, self.task, data.batch_size, self.env, self.precision)
            phases.mark("longest-batch probe")
            self.train_to_the_end()
            sync_state_buffers(self.state.model, self.env.world_size)
            if self.plan.val_loader is not None and self.last_eval.get("step") != self.state.progress.step:
                self.evaluate()
            phases.mark(TRAINING)
            self.verify_replicas()
            phases.mark("replica check")
            write_final(self.output_dir, self.state.model, self.parallel, self.task, self.data, self.env)
            phases.mark("final/")
            self.checkpointer.wait()  # the last checkpoint, when written in the background
            phases.mark("last checkpoint")
            log.info(phases.summary())
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
        progress = self.state.progress
        with (
            logging_redirect_tqdm(loggers=[log]),
            tqdm(
                total=self.plan.total_steps, initial=progress.step, disable=not show_bar, unit="step"
            ) as self.bar,
        ):
            self.throughput.restart()
            while not self.finished():
                self.run_epoch()
            self.preemption.settle()

    def finished(self) -> bool:
        progress = self.state.progress
        return progress.step >= self.plan.total_steps or progress.epoch >= self.config.train.epochs

    def final_saved(self) -> bool:
        return bool(broadcast_object((self.output_dir / "final").is_dir(), self.env))

    def run_epoch(self) -> None:
        progress, sampler = self.state.progress, self.plan.sampler
        sampler.set_epoch(progress.epoch)
        sampler.start_at(progress.epoch_samples)
        self.plan.train_loader.generator = torch.Generator().manual_seed(self.config.seed + progress.epoch)
        batches = iter(self.plan.train_loader)
        remaining_samples = len(sampler)  # this rank's, equal on every rank
        if not remaining_samples:  # resumed with a larger global batch than this epoch has left
            progress.epoch, progress.epoch_samples = progress.epoch + 1, 0
            return
        self.state.model.train()
        while remaining_samples and progress.step < self.plan.total_steps:
            window_samples = min(self.plan.samples_per_step, remaining_samples)
            loss = self.optimizer_step(batches, window_samples)
            remaining_samples -= window_samples
            progress.step += 1
            progress.epoch_samples += window_samples * self.env.world_size
            self.bar.update(1)
            self.after_step(loss, epoch_done=remaining_samples == 0)
            if self.preemption.agreed(checkpoint_due=self.clock.due()):
                self.save_checkpoint()
                # No rank exits before the checkpoint is on disk: schedulers stop a whole job when its
                # first node exits (srun --kill-on-bad-exit, a PyTorchJob restarting its pods).
                self.checkpointer.wait()
                barrier()
                raise Preempted(self.preemption.signal_name(), progress.step)
            if self.preemption.checkpoint_due and self.clock.saved_step != progress.step:
                with self.throughput.paused():
                    self.save_checkpoint()

    def optimizer_step(self, batches: Iterator, window_samples: int) -> torch.Tensor:
        """One optimizer step over the micro-batches holding this rank's ``window_samples`` samples.

        The loss of every micro-batch is summed over its targets and divided by the targets of the whole
        step, on every rank: the gradient is that of the mean over the global batch, however the targets
        fall into micro-batches and ranks. Gradients are reduced across ranks once, on the last micro-batch.
        Returns the step's mean loss on this rank's share (for logging).
        """
        state, env = self.state, self.env
        host_batches, done = [], 0
        with self.throughput.waiting_for_data():
            while done < window_samples:
                host_batches.append(next(batches))
                done += count_samples(host_batches[-1])
        step_targets = self.start_counting_targets(host_batches)
        total_loss = torch.zeros((), device=env.device)
        for index, host_batch in enumerate(host_batches):
            self.throughput.add(
                count_samples(host_batch) * env.world_size, self.data.count_tokens(host_batch)
            )
            batch = to_device(host_batch, env.device)
            last = index == len(host_batches) - 1
            with self.parallel.skip_gradient_sync(state.model, not last):
                with self.parallel.autocast():
                    summed = self.task.loss_sum(state.model, batch)
                    # DDP and FSDP2 average gradients over the ranks: the world size makes that a sum.
                    loss = summed * (env.world_size / step_targets())
                state.scaler.scale(loss).backward()
            total_loss += loss.detach().float()
        train, grad_norm = self.config.train, None
        if train.max_grad_norm:
            state.scaler.unscale_(state.optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = self.parallel.clip_grad_norm(state.model, train.max_grad_norm)
        scaled = state.scaler.is_enabled()  # fp16: the scaler skips steps with inf gradients itself
        self.nonfinite.record(state.progress.step + 1, total_loss, None if scaled else grad_norm)
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.scheduler.step()
        state.optimizer.zero_grad(set_to_none=True)
        return total_loss

    def start_counting_targets(self, host_batches: list) -> Callable[[], float]:
        return start_counting_targets(self.task.count_targets, host_batches, self.env.world_size)

    def after_step(self, loss: torch.Tensor, epoch_done: bool) -> None:
        progress, train = self.state.progress, self.config.train
        last_step = progress.step >= self.plan.total_steps
        # The first step is logged too: its loss is the sanity check, and its time the start-up's cost.
        if progress.step % train.log_every_steps == 0 or progress.step == 1 or last_step or epoch_done:
            self.log_training(loss)
        if epoch_done:
            progress.epoch += 1
            progress.epoch_samples = 0
        evaluate_now = train.eval_every_steps and progress.step % train.eval_every_steps == 0
        every = self.config.checkpoint.every_steps
        with self.throughput.paused():
            if self.plan.val_loader is not None and (evaluate_now or epoch_done or last_step):
                sync_state_buffers(self.state.model, self.env.world_size)
                self.evaluate()
            if (every and progress.step % every == 0) or epoch_done or last_step:
                self.save_checkpoint()

    def save_checkpoint(self) -> None:
        self.nonfinite.check()
        sync_state_buffers(self.state.model, self.env.world_size)
        self.checkpointer.save(self.state, self.config.to_yaml())
        self.clock.saved(self.state.progress.step)

    def log_training(self, loss: torch.Tensor) -> None:
        """The only host synchronisation of the loop: every ``train.log_every_steps`` steps, one all-reduce
        of the loss and every rank's token and data-wait counts."""
        self.nonfinite.check()
        world_size = self.env.world_size
        counts = torch.tensor(self.throughput.local_counts(), dtype=torch.float64, device=self.env.device)
        loss_sum, tokens, waited = all_reduce_sum(torch.cat([loss.double().view(1), counts])).tolist()
        # Each rank's loss is its share of the step's mean, scaled by the world size.
        mean_loss, lr = loss_sum / world_size, self.state.scheduler.get_last_lr()[0]
        speed = self.throughput.read(tokens=tokens, waited=waited, world_size=world_size)
        record = {
            "step": self.state.progress.step,
            "epoch": self.epoch_progress(),
            "loss": mean_loss,
            "lr": lr,
        }
        self.metrics.write({**record, **speed})
        self.bar.set_postfix(
            loss=f"{mean_loss:.4g}", lr=f"{lr:.3g}", samples_s=f"{speed['samples_per_s']:.1f}"
        )

    def epoch_progress(self) -> float:
        progress = self.state.progress
        per_epoch = self.plan.sampler.num_samples * self.env.world_size
        return round(progress.epoch + progress.epoch_samples / per_epoch, 4)

    def evaluate(self) -> None:
        plan = self.plan
        assert plan.val_loader is not None and plan.eval_batches is not None
        batches, task = plan.eval_batches, self.task
        results = evaluate(self.state.model, plan.val_loader, batches, task, self.env, self.parallel)
        results.update(peak_memory(self.env))  # on GPUs: the most any rank held since the last evaluation
        self.last_eval = {"step": self.state.progress.step, "epoch": self.epoch_progress(), **results}
        self.metrics.write(self.last_eval)
        self.samples.write(self.state.model, task, self.data, self.parallel, self.state.progress.step)

    def verify_replicas(self) -> None:
        """Before final/ is saved: the ranks hold what they should (replicas, or shards of one model)."""
        log.info(self.parallel.verify(self.state.model))
