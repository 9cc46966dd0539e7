"""Pre-flight checks of the custom model type (see launch/preflight.py): nothing heavy is imported here.

Add the checks your own data and model need; launch.sh runs them in a second, before torchrun starts.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Config, ConfigError
from ..config.checks import require_path


def check_config(config: Config) -> None:
    for key, value in (("data.train_file", config.data.train_file), ("data.val_file", config.data.val_file)):
        if value:  # empty: the synthetic example data
            require_path(key, value)
    if config.model.pretrained and not (Path(config.model.pretrained) / "model.safetensors").is_file():
        raise ConfigError(
            f"model.pretrained={config.model.pretrained!r} has no model.safetensors; "
            "give a directory saved by this project (e.g. a final/) or leave it empty"
        )
