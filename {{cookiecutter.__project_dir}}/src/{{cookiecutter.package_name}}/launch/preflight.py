"""The checks a run passes before any process starts: config, data paths, output_dir, the pretrained
model, the tracker's package, device.

``launch.sh``'s launcher runs them before it imports torch (``python -m <package> --check`` runs them
alone), so a mistake costs a second and prints one line. Nothing here imports torch or the model
type's libraries, whose import alone takes seconds; only a CUDA device needs torch to be checked.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..config import Config, ConfigError, Device, TrackerConfig, TrackerName
from ..config.constants import MODEL_TYPE
from ..model_type.checks import check_config
from ..task.pretrained import resolve_if_used
from .lock import refuse_if_in_use

# The module each tracker imports, and what to install for it.
TRACKER_PACKAGES = {
    TrackerName.tensorboard: ("tensorboard", "tensorboard"),
    TrackerName.wandb: ("wandb", "wandb"),
    TrackerName.mlflow: ("mlflow", "mlflow-skinny sqlalchemy alembic"),
}


def require_writable_output_dir(value: str) -> None:
    """A folder this process may create files in, or a path where one can be created; creates nothing."""
    path = Path(os.path.abspath(value))
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output_dir={value!r} is a file; give a folder (a new one starts a new run)")
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        raise ConfigError(f"output_dir={value!r} is below {existing}, a file; choose another output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"output_dir={value!r} is not writable ({existing}: no write permission, or read-only); "
            "choose another output_dir or fix the permissions"
        )


def check_tracker(config: TrackerConfig) -> None:
    """Refuse a tracker whose package is missing before any process starts, not after a rendezvous."""
    if config.name is TrackerName.none:
        return
    module, install = TRACKER_PACKAGES[config.name]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"tracker.name={config.name.value} needs the {module} package: pip install {install} "
            "(or run with tracker.name=none)"
        )


def check_eval(config: Config) -> None:
    if config.eval.generate_samples and MODEL_TYPE != "causal-lm":
        raise ConfigError("eval.generate_samples: only a causal-lm project generates text; set it to 0")
    if config.eval.num_beams != 1 and MODEL_TYPE != "seq2seq":
        raise ConfigError("eval.num_beams: only a seq2seq project generates at evaluation; set it to 1")


def check_lora(config: Config) -> None:
    """LoRA adapters need peft, and a Hugging Face model to put them on."""
    if config.lora is None:
        return
    if MODEL_TYPE == "custom":
        raise ConfigError(
            "lora: LoRA adapters go on a Hugging Face model's linear layers, and this project trains its own "
            "module; remove the lora.* overrides (or run with lora=null)"
        )
    if importlib.util.find_spec("peft") is None:
        raise ConfigError("lora needs the peft package: pip install peft (or run with lora=null)")


def check(config: Config, before_launch: bool = True) -> None:
    """Raise ``ConfigError`` naming the first thing that keeps this run from starting.

    ``before_launch``: also ask the hub about a model that is not cached, and refuse an output_dir that
    another run holds; a worker that launch.sh started leaves both to the pre-check, and the lock to rank 0.
    """
    check_config(config)
    check_tracker(config.tracker)
    check_lora(config)
    check_eval(config)
    require_writable_output_dir(config.output_dir)
    resolve_if_used(config.model.pretrained, MODEL_TYPE, use_network=before_launch)
    if before_launch:
        refuse_if_in_use(Path(config.output_dir))
    if config.distributed.device is Device.cuda:  # e.g. CUDA asked for on a CPU machine
        from ..parallel.process_group import resolve_device  # torch: only a GPU run pays for its import here

        resolve_device(config.distributed, local_rank=0)
