"""This model type's own config keys, merged into ``data`` (schema.py); defaults: model_type/defaults.yaml."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .hub_data import HubDataSettings
from .validation import require


class PaddingFree(enum.Enum):
    auto = "auto"
    always = "always"
    never = "never"


@dataclass
class DataSettings(HubDataSettings):
    text_field: str = "text"
    """The column (JSON field) holding each document of plain-text data."""
    chat_template: str = ""
    """A Jinja file that renders {"messages"} data, in place of the tokenizer's own chat template."""
    max_length: int = 256
    """Tokens per sample, capped by the model's own limit."""
    preprocessing_processes: int = 0
    """Processes that tokenize and pack the data (once per filesystem); 0: every CPU core it may use."""
    group_by_length: bool = False
    """Training batches of instruction samples of similar length, in random order: less padding, but
    less learnt per step (the bench's LoRA instruction tuning)."""
    padding_free: PaddingFree = PaddingFree.auto
    """Instruction samples of a micro-batch in one row, no padding (checked at start to stay apart):
    auto with flash attention only, always, or never."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.text_field), "data.text_field", "must name the column of the documents")
        require(self.max_length >= 8, "data.max_length", "must be >= 8")
        require(
            self.preprocessing_processes >= 0, "data.preprocessing_processes", "must be >= 0 (0 = every core)"
        )
