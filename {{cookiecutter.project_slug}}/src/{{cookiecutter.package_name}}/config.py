"""Typed configuration: YAML defaults merged with dotted ``key=value`` overrides.

OmegaConf structured configs do the parsing and type checking, so an unknown key or a value of the wrong
type is refused with the key's full name; ``__post_init__`` adds the range checks. All of it runs before
any process group exists, so a typo costs a second, not a cluster allocation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message names the key and the fix."""


class Precision(enum.Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class Backend(enum.Enum):
    nccl = "nccl"
    gloo = "gloo"


class Device(enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


class TrackerName(enum.Enum):
    none = "none"
    tensorboard = "tensorboard"
    wandb = "wandb"
    mlflow = "mlflow"


class LogLevel(enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


@dataclass
class ModelConfig:
    pretrained: str = ""  # Hugging Face hub id or local directory of the checkpoint to fine-tune


@dataclass
class DataConfig:
    train_file: str = ""  # training data (the format of this project's model type, see Data formats)
    val_file: str = ""  # evaluation data in the same format; empty: no evaluation
    batch_size: int = 16  # per process and micro-step; global batch = this x world size x grad_accum_steps
    eval_batch_size: int = 32  # samples per process per evaluation batch
    max_length: int = 256  # tokens per sample, capped by the model's own limit
    num_workers: int = 2  # DataLoader worker processes per training process; 0 loads in the training process
    group_by_length: bool = True  # batches of similar-length samples, in random order: less padding
    augment: bool = True  # image models only: random horizontal flips of the training images

    def __post_init__(self) -> None:
        _require(self.batch_size >= 1, "data.batch_size", "must be >= 1")
        _require(self.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1")
        _require(self.max_length >= 8, "data.max_length", "must be >= 8")
        _require(self.num_workers >= 0, "data.num_workers", "must be >= 0")


@dataclass
class TrainConfig:
    epochs: int = 3  # passes over the training data
    max_steps: int = 0  # cap on optimizer steps; 0 = no cap
    lr: float = 5e-5  # peak learning rate of AdamW
    weight_decay: float = 0.01  # AdamW's, not applied to biases and norm weights
    warmup_ratio: float = 0.06  # share of all steps spent warming up linearly, then linear decay to 0
    grad_accum_steps: int = 1  # micro-batches per optimizer step; gradients are all-reduced once per step
    max_grad_norm: float = 1.0  # gradient-norm clipping threshold; 0 = no clipping
    precision: Precision = Precision.bf16  # autocast; fp16 adds a scaler (CUDA only); no bf16 hardware: fp32
    log_every_steps: int = 10  # optimizer steps between training records in metrics.jsonl
    eval_every_steps: int = 0  # optimizer steps between evaluations; 0 = at the end of each epoch only
    compile: bool = False  # torch.compile the DDP-wrapped model: compiles for a while, then faster GPU steps
    peak_tflops: float = 0.0  # one device's peak in the run's precision, for mfu; 0 = known GPUs' own

    def __post_init__(self) -> None:
        _require(self.epochs >= 1, "train.epochs", "must be >= 1")
        _require(self.max_steps >= 0, "train.max_steps", "must be >= 0 (0 = no cap)")
        _require(self.lr > 0, "train.lr", "must be > 0")
        _require(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        _require(0 <= self.warmup_ratio < 1, "train.warmup_ratio", "must be in [0, 1)")
        _require(self.grad_accum_steps >= 1, "train.grad_accum_steps", "must be >= 1")
        _require(self.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0 (0 = no clipping)")
        _require(self.log_every_steps >= 1, "train.log_every_steps", "must be >= 1")
        _require(self.eval_every_steps >= 0, "train.eval_every_steps", "must be >= 0")
        _require(self.peak_tflops >= 0, "train.peak_tflops", "must be >= 0 (0 = look the GPU up)")


@dataclass
class CheckpointConfig:
    every_steps: int = 500  # steps between checkpoints (one is also saved per epoch end); 0 = epoch ends only
    keep_last: int = 3  # checkpoints kept on disk; older ones are deleted

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "checkpoint.every_steps", "must be >= 0")
        _require(self.keep_last >= 1, "checkpoint.keep_last", "must be >= 1")


@dataclass
class DistributedConfig:
    backend: Backend = Backend.nccl  # nccl on GPUs, gloo on CPU
    device: Device = Device.cuda  # cuda: one GPU per process, chosen by LOCAL_RANK
    timeout_s: int = 1800  # a collective that waits longer ends the job instead of hanging it
    find_unused_parameters: bool = False  # DDP: slower; only for models that skip parameters in forward
    gradient_as_bucket_view: bool = True  # DDP: gradients live in the all-reduce buckets (one copy less)
    static_graph: bool = False  # DDP optimisation for models whose graph never changes between steps

    def __post_init__(self) -> None:
        _require(self.timeout_s >= 1, "distributed.timeout_s", "must be >= 1")
        _require(
            not (self.backend is Backend.nccl and self.device is Device.cpu),
            "distributed.backend",
            "nccl needs distributed.device=cuda; use distributed.backend=gloo on CPU",
        )


@dataclass
class TrackerConfig:
    name: TrackerName = TrackerName.none  # experiment tracker fed by rank 0 with every metrics.jsonl record
    project: str = ""  # wandb project / mlflow experiment; empty: the project's name
    run_name: str = ""  # empty: the name of output_dir; a resumed run continues the same tracker run


@dataclass
class Config:
    output_dir: str = "outputs/run"  # metrics.jsonl, checkpoints/ and final/ go here
    seed: int = 42  # data order, initialisation of new heads, dropout (offset by rank)
    log_level: LogLevel = LogLevel.info  # rank 0's console; other ranks show warnings and errors only
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)

    def __post_init__(self) -> None:
        _require(bool(self.output_dir.strip()), "output_dir", "must not be empty")
        _require(
            not (self.train.precision is Precision.fp16 and self.distributed.device is Device.cpu),
            "train.precision",
            "fp16 needs CUDA; use train.precision=bf16 or fp32 on CPU",
        )

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.structured(self))


def default_config_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("defaults.yaml")))


def load_config(overrides: list[str], defaults: Path | None = None) -> Config:
    """Merge the defaults file with ``key=value`` overrides and validate the result."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"argument {item!r} is not key=value; write e.g. train.lr=1e-4")
    # YAML reads an empty value as null; on the command line `key=` means an empty string.
    overrides = [f"{item}''" if item.endswith("=") else item for item in overrides]
    path = defaults or default_config_path()
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(Config),
            OmegaConf.load(path),
            OmegaConf.from_dotlist(overrides),
        )
        config = OmegaConf.to_object(merged)
    except ConfigKeyError as error:
        raise ConfigError(f"{error.full_key}: unknown config key; the valid keys are in {path}") from None
    except OmegaConfBaseException as error:
        reason = str(error.msg if hasattr(error, "msg") else error).splitlines()[0]
        raise ConfigError(f"{error.full_key or path}: {reason}") from None
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
