"""This model type's own config keys, merged into ``data`` (schema.py); defaults: model_type/defaults.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from .hub_data import HubDataSettings
from .validation import require


@dataclass
class DataSettings(HubDataSettings):
    image_field: str = "image"
    """The column of data.hub_dataset holding the images."""
    label_field: str = "label"
    """The column of data.hub_dataset holding each label: a class id, a class name, or a ClassLabel."""
    augment: bool = True
    """Random horizontal flips of the training images."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.image_field), "data.image_field", "must name the column of the images")
        require(bool(self.label_field), "data.label_field", "must name the column of the labels")
