"""Before the first step, the largest micro-batch the data can form goes through the model once, forward
and backward: a batch that does not fit in memory fails at the start, not hours in, whatever order the
sampler draws. It leaves no trace: no optimizer step, the gradients dropped, the buffers (BatchNorm
statistics) and every random number generator as they were.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import ConfigError, Precision
from ..data.loader import to_device
from ..parallel.precision import autocast
from ..parallel.process_group import DistEnv
from ..parallel.rng import capture_rng_state, restore_rng_state
from ..parallel.training_state import TrainingState
from ..task.spec import Task, TaskData


def longest_samples(lengths: Sequence[int] | torch.Tensor, count: int) -> list[int]:
    """The indices of the ``count`` longest samples: padded to the longest of them, no micro-batch of
    ``count`` samples is larger. ``lengths`` goes to torch whole: a million Python ints (or 0-d tensors)
    made one by one cost seconds before the first step."""
    order = torch.argsort(torch.as_tensor(lengths), descending=True, stable=True)
    return order[:count].tolist()


def try_longest_batch(
    state: TrainingState, data: TaskData, task: Task, batch_size: int, env: DistEnv, precision: Precision
) -> None:
    """One forward and backward of this rank's largest possible micro-batch, on every rank (DDP reduces
    the gradients as in a real step). Data without lengths, or of one length (packed blocks, text cut to
    data.max_length), has micro-batches of one size: the first step is that batch, and nothing is done."""
    if data.train_lengths is None:
        return
    lengths = torch.as_tensor(data.train_lengths)
    if lengths.numel() == 0 or bool((lengths == lengths[0]).all()):
        return
    indices = longest_samples(lengths, batch_size)
    batch = to_device(data.collate([data.train[i] for i in indices]), env.device)
    generators = capture_rng_state()  # dropout draws from them
    buffers = {name: buffer.detach().clone() for name, buffer in state.module.named_buffers()}
    try:
        with autocast(precision, env.device):
            loss = task.loss_sum(state.model, batch)
        loss.backward()
    except torch.OutOfMemoryError:
        longest = int(lengths[indices].max())
        raise ConfigError(
            f"data.batch_size: {batch_size} samples of {longest} tokens (the longest in the training data) "
            "do not fit in memory; lower data.batch_size (raising train.grad_accum_steps keeps the global "
            "batch) or data.max_length"
        ) from None
    finally:
        state.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, buffer in state.module.named_buffers():
                buffer.copy_(buffers[name])
        restore_rng_state(generators)
