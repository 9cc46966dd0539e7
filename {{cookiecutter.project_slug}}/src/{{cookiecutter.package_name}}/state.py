"""The training state: what one optimizer step changes, what a checkpoint saves and a resume restores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from .model import unwrap


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
    progress: Progress = field(default_factory=Progress)

    @property
    def module(self) -> nn.Module:
        """The user's model, without the DDP and torch.compile wrappers (and their name prefixes)."""
        return unwrap(self.model)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": vars(self.progress).copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises RuntimeError, ValueError or KeyError when the state belongs to another model."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
