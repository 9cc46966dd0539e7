"""This model type's own config keys, merged into ``data`` (schema.py); defaults: model_type/defaults.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from .hub_data import HubDataSettings
from .validation import require


@dataclass
class DataSettings(HubDataSettings):
    source_field: str = "source"
    """The column (JSON field) holding each input text."""
    target_field: str = "target"
    """The column (JSON field) holding each output text the model learns to write."""
    source_prefix: str = ""
    """Text put before every source, in training, evaluation and predict (e.g. `summarize: ` for T5);
    saved with the model."""
    max_length: int = 256
    """Tokens per source, capped by the model's own limit."""
    max_target_length: int = 128
    """Tokens per target (its end-of-text token included); longer targets are cut for the loss only."""
    group_by_length: bool = False
    """Batches of samples of similar length, in random order: less padding, but less learnt per step."""
    preprocessing_processes: int = 0
    """Processes that tokenize the data (once per filesystem); 0: every CPU core the process may use."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.source_field), "data.source_field", "must name the column of the sources")
        require(bool(self.target_field), "data.target_field", "must name the column of the targets")
        require(
            self.source_field != self.target_field, "data.target_field", "must differ from data.source_field"
        )
        require(self.max_length >= 8, "data.max_length", "must be >= 8")
        require(self.max_target_length >= 2, "data.max_target_length", "must be >= 2")
        require(
            self.preprocessing_processes >= 0, "data.preprocessing_processes", "must be >= 0 (0 = every core)"
        )
