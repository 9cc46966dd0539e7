"""An elastic job (launch.sh's ``NNODES=MIN:MAX``) that goes on with fewer nodes keeps its global batch.

The global batch is planned for MAX nodes: ``data.batch_size x processes x train.grad_accum_steps``. When
torchrun restarts the job on the nodes left, each process takes a larger share of it in more micro-steps,
so the optimizer sees the same batches as before the loss: the sampler draws the samples of a global step
whatever the world size (data/sampling.py), and the loss is normalised per global step, so the weights
differ from an uninterrupted run by the order of the float sums only.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from ..config import Config, ConfigError

MAX_NNODES_ENV = "LAUNCH_MAX_NNODES"  # set by launch.sh: the nodes the global batch is planned for
log = logging.getLogger(__name__)


def planned_world_size(world_size: int) -> int:
    """The processes the global batch is planned for: MAX nodes of this node's processes each."""
    max_nodes = int(os.environ.get(MAX_NNODES_ENV) or 0)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or world_size)
    return max(world_size, max_nodes * per_node)


def keep_global_batch(config: Config, world_size: int) -> Config:
    """``config`` with the micro-batch and accumulation that give the planned global batch on
    ``world_size`` processes: the same micro-batch where it divides each process's share, else the
    largest one below it that does (memory never grows)."""
    planned = planned_world_size(world_size)
    if planned == world_size:
        return config
    batch, accumulation = config.data.batch_size, config.train.grad_accum_steps
    global_batch = batch * planned * accumulation
    if global_batch % world_size:
        raise ConfigError(
            f"this elastic job goes on with {world_size} of its {planned} processes, which cannot share its "
            f"global batch of {global_batch} (data.batch_size x {planned} x train.grad_accum_steps) evenly; "
            f"make data.batch_size x train.grad_accum_steps a multiple of {world_size}, or run on all nodes"
        )
    share = global_batch // world_size
    micro = next(size for size in range(min(batch, share), 0, -1) if share % size == 0)
    log.info(
        f"elastic job on {world_size} of {planned} processes: each process accumulates {share // micro} "
        f"micro-batches of {micro}, so the global batch stays {global_batch}"
    )
    return dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, batch_size=micro),
        train=dataclasses.replace(config.train, grad_accum_steps=share // micro),
    )
