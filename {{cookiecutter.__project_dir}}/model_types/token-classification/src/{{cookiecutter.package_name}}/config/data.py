"""This model type's own config keys, merged into ``data`` (schema.py); defaults: model_type/defaults.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from .hub_data import HubDataSettings
from .validation import require


@dataclass
class DataSettings(HubDataSettings):
    tokens_field: str = "tokens"
    """The column (JSON field) holding each sentence's words: a list of strings."""
    tags_field: str = "tags"
    """The column (JSON field) holding each sentence's tags, one per word: a list of strings such as `O`,
    `B-PER`, `I-PER` (IOB1, IOB2, IOE or IOBES)."""
    max_length: int = 256
    """Sub-word tokens per sentence, capped by the model's own limit; words past it are not seen by the
    model, and count as tagged `O` in the metrics (logged at start)."""
    group_by_length: bool = True
    """Batches of similar-length samples, in random order: less padding."""
    preprocessing_processes: int = 0
    """Processes that tokenize the data (once per filesystem); 0: every CPU core the process may use."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.tokens_field), "data.tokens_field", "must name the column of the words")
        require(bool(self.tags_field), "data.tags_field", "must name the column of the tags")
        require(self.tokens_field != self.tags_field, "data.tags_field", "must differ from data.tokens_field")
        require(self.max_length >= 8, "data.max_length", "must be >= 8")
        require(
            self.preprocessing_processes >= 0, "data.preprocessing_processes", "must be >= 0 (0 = every core)"
        )
