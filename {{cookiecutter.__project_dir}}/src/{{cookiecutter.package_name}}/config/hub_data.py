"""Config keys of the model types that read their data through Hugging Face ``datasets``.

Each such type's ``DataSettings`` (config/data.py) derives from ``HubDataSettings``, so the keys
exist, documented, in those projects only; a custom project has none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .validation import require


@dataclass
class HubDataSettings:
    hub_dataset: str = ""
    """A Hugging Face hub dataset id, or a local folder of data files or one saved with `save_to_disk`, read
    the way `load_dataset` reads it (a hub id offline from the local hub cache when `HF_HUB_OFFLINE=1`);
    when set, data.train_file and data.val_file are not read."""
    train_split: str = "train"
    """The split of data.hub_dataset to train on."""
    val_split: str = "validation"
    """The split of data.hub_dataset to evaluate on; empty: no evaluation."""

    def __post_init__(self) -> None:
        require(
            not self.hub_dataset or bool(self.train_split),
            "data.train_split",
            "must name a split of data.hub_dataset (e.g. train)",
        )
