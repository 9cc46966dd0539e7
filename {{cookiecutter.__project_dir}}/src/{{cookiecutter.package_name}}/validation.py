"""The error every settings class raises, and its range check (config.py, model_type/settings.py)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message names the key and the fix."""


def require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")
