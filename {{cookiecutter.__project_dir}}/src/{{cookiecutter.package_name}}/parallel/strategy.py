"""How the model is spread over the processes, picked by ``distributed.strategy``: DDP replicas (here) or
FSDP2 shards (parallel/fsdp.py). The training loop is one loop for both: it calls only what ``Parallel``
declares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch
from torch import nn

from ..config import CheckpointConfig, DistributedConfig, Precision, Strategy
from .checkpoint import Layout, SingleFile
from .ddp import parameter_checksums, skip_gradient_sync, unwrap, wrap_ddp
from .precision import autocast, grad_scaler
from .process_group import DistEnv, gather_objects


class Parallel(Protocol):
    equal_forwards: bool
    """Whether every rank must run as many forwards as the others (each one then talks to them)."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model on this rank's device, ready to train; adapters must be in it already."""

    def autocast(self) -> AbstractContextManager:
        """Around each forward: the training precision, where the wrapper does not cast by itself."""

    def grad_scaler(self) -> torch.amp.GradScaler: ...

    def skip_gradient_sync(self, model: nn.Module, skip: bool) -> AbstractContextManager:
        """Around the micro-steps of an accumulation window that are not its last."""

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the whole model's gradient to ``max_norm``; return its norm before clipping."""

    def verify(self, model: nn.Module) -> str:
        """A collective before ``final/`` is saved: raises when the ranks disagree; says what it proved."""

    def full_model(self, model: nn.Module) -> AbstractContextManager[nn.Module | None]:
        """A collective: the plain trained model on rank 0, for ``final/`` (None on the other ranks)."""

    def checkpoint_layout(self, config: CheckpointConfig) -> Layout: ...


class Replicated:
    """DDP: a full replica on every rank, gradients all-reduced once per optimizer step."""

    equal_forwards = False

    def __init__(self, env: DistEnv, config: DistributedConfig, precision: Precision) -> None:
        self.env, self.config, self.precision = env, config, precision

    def wrap(self, model: nn.Module) -> nn.Module:
        return wrap_ddp(model, self.env, self.config)

    def autocast(self) -> AbstractContextManager:
        return autocast(self.precision, self.env.device)

    def grad_scaler(self) -> torch.amp.GradScaler:
        return grad_scaler(self.precision, self.env.device)

    def skip_gradient_sync(self, model: nn.Module, skip: bool) -> AbstractContextManager:
        return skip_gradient_sync(model, skip)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def verify(self, model: nn.Module) -> str:
        """DDP keeps replicas identical by construction; prove it before saving one of them."""
        checksums = gather_objects(parameter_checksums(model), self.env)
        for rank, theirs in enumerate(checksums):
            differing = [mine[0] for mine, other in zip(checksums[0], theirs, strict=True) if mine != other]
            if differing:
                raise RuntimeError(f"rank {rank} holds different values of {differing[0]} than rank 0")
        return f"parameters identical on all {self.env.world_size} rank(s)"

    @contextmanager
    def full_model(self, model: nn.Module) -> Iterator[nn.Module | None]:
        yield unwrap(model)

    def checkpoint_layout(self, config: CheckpointConfig) -> Layout:
        return SingleFile(self.env)


def build_parallel(config: DistributedConfig, env: DistEnv, precision: Precision) -> Parallel:
    if config.strategy is Strategy.fsdp2:
        from .fsdp import Sharded  # imports FSDP2 and DCP, which a ddp run does without

        return Sharded(env, config, precision)
    return Replicated(env, config, precision)
