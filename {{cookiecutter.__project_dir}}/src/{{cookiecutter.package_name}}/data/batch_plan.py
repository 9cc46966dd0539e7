"""The batches of a run: the training sampler and loader, the evaluation batches, and the step counts."""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import DataLoader

from ..config import Config
from ..parallel.process_group import DistEnv
from ..task.spec import TaskData, dataset_size
from .loader import DataError, make_loader
from .sampling import EvalBatches, ResumableDistributedSampler


@dataclass
class BatchPlan:
    sampler: ResumableDistributedSampler
    train_loader: DataLoader
    eval_batches: EvalBatches | None
    val_loader: DataLoader | None
    samples_per_step: int
    """This rank's samples per optimizer step (all its micro-batches)."""
    steps_per_epoch: int
    total_steps: int

    @property
    def left_out(self) -> int:
        """Training samples that sit out each epoch: fewer than one global batch."""
        return dataset_size(self.sampler.dataset) - self.sampler.total_size


def plan_batches(data: TaskData, config: Config, env: DistEnv) -> BatchPlan:
    train = config.train
    global_batch = config.data.batch_size * env.world_size * train.grad_accum_steps
    sampler = ResumableDistributedSampler(
        data.train,
        env,
        config.seed,
        global_batch=global_batch,
        lengths=data.train_lengths if data.group_by_length else None,
    )
    if not sampler.total_size:
        raise DataError(
            f"the training set has {dataset_size(data.train)} samples, fewer than one global batch of "
            f"{global_batch} (data.batch_size x {env.world_size} process(es) x train.grad_accum_steps); "
            "lower data.batch_size or train.grad_accum_steps, or add training data"
        )
    train_loader = make_loader(
        data.train, data, config, env, sampler=sampler, batch_size=config.data.batch_size
    )
    eval_batches, val_loader = None, None
    if data.val is not None:
        eval_batches = EvalBatches(
            dataset_size(data.val),
            config.data.eval_batch_size,
            env,
            lengths=data.val_lengths,
        )
        val_loader = make_loader(data.val, data, config, env, batch_sampler=eval_batches)
    samples_per_step = config.data.batch_size * train.grad_accum_steps
    steps_per_epoch = sampler.num_samples // samples_per_step
    total_steps = steps_per_epoch * train.epochs
    if train.max_steps:
        total_steps = min(total_steps, train.max_steps)
    return BatchPlan(
        sampler, train_loader, eval_batches, val_loader, samples_per_step, steps_per_epoch, total_steps
    )
