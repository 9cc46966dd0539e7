"""This model type's own config keys, merged into ``data`` (schema.py); defaults: model_type/defaults.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from .hub_data import HubDataSettings
from .validation import require


@dataclass
class DataSettings(HubDataSettings):
    text_field: str = "text"
    """The column (JSON field) holding each text."""
    label_field: str = "label"
    """The column (JSON field) holding each label: an integer class id, or a class name."""
    max_length: int = 256
    """Tokens per sample, capped by the model's own limit."""
    group_by_length: bool = True
    """Batches of similar-length samples, in random order: less padding."""
    preprocessing_processes: int = 0
    """Processes that tokenize the data (once per filesystem); 0: every CPU core the process may use."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.text_field), "data.text_field", "must name the column of the texts")
        require(bool(self.label_field), "data.label_field", "must name the column of the labels")
        require(self.max_length >= 8, "data.max_length", "must be >= 8")
        require(
            self.preprocessing_processes >= 0, "data.preprocessing_processes", "must be >= 0 (0 = every core)"
        )
