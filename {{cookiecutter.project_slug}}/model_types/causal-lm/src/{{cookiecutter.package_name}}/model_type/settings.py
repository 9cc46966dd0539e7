"""This model type's own config keys, merged into ``data`` (see config.py); defaults in defaults.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import require


@dataclass
class DataSettings:
    max_length: int = 256
    """Tokens per sample, capped by the model's own limit."""

    def __post_init__(self) -> None:
        require(self.max_length >= 8, "data.max_length", "must be >= 8")
