"""Pre-flight checks of image classification (see launch/preflight.py): nothing heavy is imported here."""

from __future__ import annotations

from pathlib import Path

from ..config import Config, ConfigError
from ..config.checks import require_path, require_pretrained


def require_folder(key: str, value: str) -> None:
    require_path(key, value)
    if not Path(value).is_dir():
        raise ConfigError(
            f"{key}={value!r} is a file; for image classification it names a folder "
            "with one sub-folder of images per class"
        )


def check_config(config: Config) -> None:
    require_pretrained(config)
    if config.data.hub_dataset:  # a hub id is no path: it is read, and checked, when the run starts
        return
    require_folder("data.train_file", config.data.train_file)
    if config.data.val_file:
        require_folder("data.val_file", config.data.val_file)
