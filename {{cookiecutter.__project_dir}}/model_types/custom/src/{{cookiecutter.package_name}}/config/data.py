"""This model type's own config keys, merged into ``data`` (schema.py); defaults: model_type/defaults.yaml.

Add a field here (with a docstring, which becomes its line in the README's config reference) for every
setting your data or model needs; it is then ``config.data.<name>`` and overridable as ``data.<name>=...``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataSettings:
    def __post_init__(self) -> None:
        pass
