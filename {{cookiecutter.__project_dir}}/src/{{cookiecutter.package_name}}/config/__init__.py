"""Configuration: the schema of every key, the defaults rendered from the answers, and loading them with
``key=value`` overrides. Imports nothing else of the package, so every other room may import it.

The rest of the package imports the names below from here; the modules are:
schema.py (sections and keys), data.py (this model type's ``data`` keys), hub_data.py (the keys of types
that read through ``datasets``), keys.py (key names), loading.py (defaults + overrides), validation.py
(``ConfigError`` and range checks), checks.py (path checks the model types share), constants.py (the
answers the code branches on), cli.py (argument parsing of the side commands), defaults.yaml.
"""

from .keys import public_key
from .loading import default_config_path, load_config, model_type_defaults_path
from .schema import (
    Backend,
    CheckpointConfig,
    Config,
    DataConfig,
    Device,
    DistributedConfig,
    EvalConfig,
    LogLevel,
    LoraConfig,
    ModelConfig,
    Precision,
    SharedDataConfig,
    Strategy,
    TrackerConfig,
    TrackerName,
    TrainConfig,
)
from .validation import ConfigError, require

__all__ = [
    "Backend",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "Device",
    "DistributedConfig",
    "EvalConfig",
    "LogLevel",
    "LoraConfig",
    "ModelConfig",
    "Precision",
    "SharedDataConfig",
    "Strategy",
    "TrackerConfig",
    "TrackerName",
    "TrainConfig",
    "default_config_path",
    "load_config",
    "model_type_defaults_path",
    "public_key",
    "require",
]
