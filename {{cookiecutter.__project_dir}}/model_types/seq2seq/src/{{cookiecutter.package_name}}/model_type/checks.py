"""Pre-flight checks of sequence to sequence (launch/preflight.py runs them): nothing heavy imported."""

from __future__ import annotations

from ..config import Config
from ..config.checks import require_file, require_pretrained


def check_config(config: Config) -> None:
    require_pretrained(config)
    if config.data.hub_dataset:  # a hub id is no path: it is read, and checked, when the run starts
        return
    require_file("data.train_file", config.data.train_file)
    if config.data.val_file:
        require_file("data.val_file", config.data.val_file)
