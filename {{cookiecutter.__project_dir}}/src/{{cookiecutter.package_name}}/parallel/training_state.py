"""The training state: what one optimizer step changes, what a checkpoint saves and a resume restores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from .ddp import unwrap


@dataclass
class Progress:
    step: int = 0
    """Optimizer steps done."""
    epoch: int = 0
    """The epoch in progress."""
    epoch_samples: int = 0
    """Samples of this epoch the whole job has consumed (all ranks together)."""


@dataclass
class TrainingState:
    """Model (as wrapped for training), optimizer, schedule, loss scaler and progress: saved whole."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    scaler: torch.amp.GradScaler
    frozen_base: bool = False
    """LoRA: the pretrained parameters are frozen, so checkpoints leave them out (a resume loads them from
    ``model.pretrained`` again) and hold the trainable ones, state buffers and their optimizer state."""
    progress: Progress = field(default_factory=Progress)

    @property
    def module(self) -> nn.Module:
        """The user's model, without the DDP and torch.compile wrappers (and their name prefixes)."""
        return unwrap(self.model)

    def model_state(self) -> dict[str, torch.Tensor]:
        """What checkpoints hold of the model: all of its state, or without the frozen base's parameters."""
        state = self.module.state_dict()
        if not self.frozen_base:
            return state
        parameters = self.module.named_parameters(remove_duplicate=False)
        frozen = {name for name, parameter in parameters if not parameter.requires_grad}
        return {name: tensor for name, tensor in state.items() if name not in frozen}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": vars(self.progress).copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises RuntimeError, ValueError or KeyError when the state belongs to another model."""
        expected, saved = set(self.model_state()), set(state["model"])
        if saved != expected:
            name = sorted(saved - expected or expected - saved)[0]
            raise RuntimeError(f"{'unexpected' if name in saved else 'missing'} {name}")
        self.module.load_state_dict(state["model"], strict=not self.frozen_base)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
