"""Loading a run's config: the defaults files merged with dotted ``key=value`` overrides, validated."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from .constants import PACKAGE
from .keys import field_name, public_key, renamed
from .schema import Config
from .validation import ConfigError


def _load_yaml(path: Path) -> DictConfig:
    return OmegaConf.create(renamed(OmegaConf.to_container(OmegaConf.load(path)), field_name))


def default_config_path() -> Path:
    """The shared loop's defaults, rendered from the template answers."""
    return Path(str(resources.files(f"{PACKAGE}.config").joinpath("defaults.yaml")))


def model_type_defaults_path() -> Path:
    """This model type's defaults: its data paths and its own keys."""
    return Path(str(resources.files(f"{PACKAGE}.model_type").joinpath("defaults.yaml")))


def _dotted(key: str | None, rename: Callable[[str], str]) -> str | None:
    return ".".join(rename(part) for part in key.split(".")) if key else key


def load_config(overrides: list[str], defaults: Path | None = None) -> Config:
    """Merge the defaults files with ``key=value`` overrides and validate the result."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"argument {item!r} is not key=value; write e.g. train.lr=1e-4")
    # YAML reads an empty value as null; on the command line `key=` means an empty string.
    overrides = [f"{item}''" if item.endswith("=") else item for item in overrides]
    overrides = [f"{_dotted(key, field_name)}={value}" for key, value in (o.split("=", 1) for o in overrides)]
    path = defaults or default_config_path()
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(Config),
            _load_yaml(path),
            _load_yaml(model_type_defaults_path()),
            OmegaConf.from_dotlist(overrides),
        )
        config = OmegaConf.to_object(merged)
    except ConfigKeyError as error:
        valid = f"python -m {PACKAGE}.config_reference lists the valid keys"
        raise ConfigError(f"{_dotted(error.full_key, public_key)}: unknown config key; {valid}") from None
    except OmegaConfBaseException as error:
        reason = str(error.msg if hasattr(error, "msg") else error).splitlines()[0]
        raise ConfigError(f"{_dotted(error.full_key, public_key) or path}: {reason}") from None
    except yaml.YAMLError as error:
        raise ConfigError(_not_yaml(overrides, path, error)) from None
    assert isinstance(config, Config)
    return config


def _not_yaml(overrides: list[str], path: Path, error: yaml.YAMLError) -> str:
    """Which override, or which line of the defaults file, YAML cannot read, and why."""
    for item in overrides:
        try:
            OmegaConf.from_dotlist([item])
        except yaml.YAMLError as problem:
            key, value = item.split("=", 1)
            return (
                f"{key}: {value!r} is not a YAML value ({getattr(problem, 'problem', problem)}); "
                f"close the brackets, or quote a string: {key}='\"...\"'"
            )
    mark = getattr(error, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark else str(path)
    return f"{where}: not valid YAML ({getattr(error, 'problem', error)}); fix that line"
