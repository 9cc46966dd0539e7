"""This model type's own config keys, merged into ``data`` (see config.py); defaults in defaults.yaml."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataSettings:
    augment: bool = True
    """Random horizontal flips of the training images."""

    def __post_init__(self) -> None:
        pass
