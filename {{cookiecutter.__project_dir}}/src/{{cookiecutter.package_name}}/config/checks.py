"""Checks of config values that every model type's pre-flight (model_type/checks.py) draws on."""

from __future__ import annotations

from pathlib import Path

from .schema import Config
from .validation import ConfigError


def require_path(key: str, value: str) -> None:
    if not value:
        raise ConfigError(f"{key} is empty; give the path of your data")
    if not Path(value).exists():
        raise ConfigError(f"{key}={value!r} does not exist; check the path")


def require_file(key: str, value: str) -> None:
    require_path(key, value)
    if Path(value).is_dir():
        raise ConfigError(f"{key}={value!r} is a folder; give the data file itself")


def require_pretrained(config: Config) -> None:
    if not config.model.pretrained:
        raise ConfigError("model.pretrained is empty; give a Hugging Face hub id or a local directory")
