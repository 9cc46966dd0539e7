"""The error every settings class raises, and its range checks (schema.py, data.py, hub_data.py)."""

from __future__ import annotations

import dataclasses
import math


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message names the key and the fix."""


def require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def require_finite(node: object, prefix: str = "") -> None:
    """inf and nan parse as floats, and pass every range check that compares with them."""
    for item in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value):
            require_finite(value, f"{prefix}{item.name}.")
        elif isinstance(value, float):
            require(math.isfinite(value), f"{prefix}{item.name}", f"{value} is not a finite number")
