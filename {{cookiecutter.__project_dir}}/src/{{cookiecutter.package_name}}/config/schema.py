"""The config's schema: every section and key as a typed, documented dataclass.

OmegaConf structured configs do the parsing and type checking (loading.py), so an unknown key or a value of
the wrong type is refused with the key's full name; ``__post_init__`` adds the range checks. All of it runs
before any process group exists, so a typo costs a second, not a cluster allocation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from .data import DataSettings
from .keys import public_key, renamed
from .validation import require, require_finite


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


class Strategy(enum.Enum):
    ddp = "ddp"
    fsdp2 = "fsdp2"


class TrackerName(enum.Enum):
    none = "none"
    tensorboard = "tensorboard"
    wandb = "wandb"
    mlflow = "mlflow"


class LogLevel(enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"


@dataclass
class ModelConfig:
    pretrained: str = ""
    """Hugging Face hub id or local directory of the checkpoint to fine-tune."""
    gradient_checkpointing: bool = False
    """Recompute each block's activations in the backward pass instead of keeping them (non-reentrant):
    less memory, about a third more compute. Hugging Face models."""


@dataclass
class LoraConfig:
    """LoRA adapters through peft: the section exists only in runs that train adapters (see the README)."""

    r: int = 16
    """LoRA: rank of each adapter's update matrices."""
    alpha: int = 32
    """LoRA: the update is scaled by alpha / r."""
    dropout: float = 0.05
    """LoRA: dropout on the adapters' input."""
    target_modules: str = "all-linear"
    """LoRA: `all-linear` (every linear layer but the output layer), or module names, comma-separated
    (e.g. `q_proj,v_proj`); never the classification head, which trains whole."""

    def __post_init__(self) -> None:
        require(self.r >= 1, "lora.r", "must be >= 1")
        require(self.alpha > 0, "lora.alpha", "must be > 0")
        require(0 <= self.dropout < 1, "lora.dropout", "must be in [0, 1)")
        names = self.target_modules.replace(",", " ").split()
        require(bool(names), "lora.target_modules", "must be all-linear or name modules (comma-separated)")


@dataclass
class SharedDataConfig:
    train_file: str = ""
    """Training data, in this project's model-type format (see Data formats)."""
    val_file: str = ""
    """Evaluation data in the same format; empty: no evaluation."""
    batch_size: int = 16
    """Samples per process and micro-step; global batch = this x world size x grad_accum_steps."""
    eval_batch_size: int = 32
    """Samples per process per evaluation batch."""
    num_workers: int = 2
    """DataLoader worker processes per training process; 0 loads in the training process."""

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "data.batch_size", "must be >= 1")
        require(self.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1")
        require(self.num_workers >= 0, "data.num_workers", "must be >= 0")


@dataclass
class DataConfig(DataSettings, SharedDataConfig):
    """The shared data keys, then this model type's own (config/data.py)."""

    def __post_init__(self) -> None:
        SharedDataConfig.__post_init__(self)
        DataSettings.__post_init__(self)


@dataclass
class TrainConfig:
    epochs: int = 3
    """Passes over the training data."""
    max_steps: int = 0
    """Cap on optimizer steps; 0 = no cap."""
    lr: float = 5e-5
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay, not applied to biases and norm weights."""
    warmup_ratio: float = 0.06
    """Share of all steps spent warming up linearly, then linear decay to 0."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; gradients are reduced across processes once per step."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping threshold; 0 = no clipping."""
    precision: Precision = Precision.bf16
    """Autocast dtype; fp16 adds a gradient scaler (CUDA only); bf16 without bf16 hardware: fp32."""
    log_every_steps: int = 10
    """Optimizer steps between training records in metrics.jsonl."""
    eval_every_steps: int = 0
    """Optimizer steps between evaluations; 0 = at the end of each epoch only."""
    compile: bool = False
    """`torch.compile` the wrapped model: compiles for a while, then faster GPU steps."""
    peak_tflops: float = 0.0
    """One device's peak in the run's precision, for mfu; 0 = known GPUs' own."""

    def __post_init__(self) -> None:
        require(self.epochs >= 1, "train.epochs", "must be >= 1")
        require(self.max_steps >= 0, "train.max_steps", "must be >= 0 (0 = no cap)")
        require(self.lr > 0, "train.lr", "must be > 0")
        require(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        require(0 <= self.warmup_ratio < 1, "train.warmup_ratio", "must be in [0, 1)")
        require(self.grad_accum_steps >= 1, "train.grad_accum_steps", "must be >= 1")
        require(self.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0 (0 = no clipping)")
        require(self.log_every_steps >= 1, "train.log_every_steps", "must be >= 1")
        require(self.eval_every_steps >= 0, "train.eval_every_steps", "must be >= 0")
        require(self.peak_tflops >= 0, "train.peak_tflops", "must be >= 0 (0 = look the GPU up)")


@dataclass
class EvalConfig:
    generate_samples: int = 0
    """causal-lm: greedy completions of the first N validation prompts, added to samples.jsonl at each
    evaluation; 0 = none."""
    max_new_tokens: int = 64
    """Tokens each of those completions may add (seq2seq: each generated target, at evaluation and as
    predict's default)."""
    num_beams: int = 1
    """seq2seq: beams of the generation at evaluation and predict's default; 1 = greedy."""
    generation_metrics: bool = True
    """seq2seq: eval_bleu and eval_rougeL from targets generated for the whole validation set at each
    evaluation; false: eval_loss and eval_perplexity alone (much faster)."""

    def __post_init__(self) -> None:
        require(self.generate_samples >= 0, "eval.generate_samples", "must be >= 0 (0 = none)")
        require(self.max_new_tokens >= 1, "eval.max_new_tokens", "must be >= 1")
        require(self.num_beams >= 1, "eval.num_beams", "must be >= 1 (1 = greedy)")


@dataclass
class CheckpointConfig:
    every_steps: int = 500
    """Steps between checkpoints (one is also saved per epoch end); 0 = epoch ends only."""
    every_minutes: float = 0.0
    """Wall-clock minutes between checkpoints, beside every_steps (whichever comes first); 0 = off.
    Every rank saves after the same step: the first rank whose clock says so decides for all."""
    keep_last: int = 3
    """Checkpoints kept on disk; older ones are deleted."""
    start_over: bool = False
    """Move this output_dir's checkpoints, metrics and final/ into previous-<n>/ and train from step 0.
    For a one-off rerun: a requeued job with it would start over at every restart."""
    async_: bool = False
    """fsdp2: write checkpoints in the background (`dcp.async_save`) while training goes on; the next
    save, the end of the run and a preemption wait for the write."""

    def __post_init__(self) -> None:
        require(self.every_steps >= 0, "checkpoint.every_steps", "must be >= 0")
        require(self.every_minutes >= 0, "checkpoint.every_minutes", "must be >= 0")
        require(self.keep_last >= 1, "checkpoint.keep_last", "must be >= 1")


@dataclass
class DistributedConfig:
    backend: Backend = Backend.nccl
    """`nccl` on GPUs, `gloo` on CPU."""
    device: Device = Device.cuda
    """`cuda`: one GPU per process, chosen by LOCAL_RANK; `cpu`: no GPU."""
    timeout_s: int = 1800
    """A collective that waits longer ends the job instead of hanging it."""
    node_timeout_s: int = 30
    """A node silent this long (killed, frozen, cut off) is lost: every other node ends within about
    twice this, with exit 75 and one line naming it. Liveness, not progress: a slow node is not lost."""
    strategy: Strategy = Strategy.ddp
    """`ddp`: a full replica per process; `fsdp2`: parameters, gradients and optimizer state sharded
    over the processes (FSDP2 `fully_shard`), for models that do not fit one GPU."""
    fsdp_wrap: str = ""
    """fsdp2: class names of the blocks sharded one by one (comma-separated); empty: the model's
    `_no_split_modules`, else the layers of its block list."""
    find_unused_parameters: bool = False
    """DDP: slower; only for models that skip parameters in forward."""
    gradient_as_bucket_view: bool = True
    """DDP: gradients live in the all-reduce buckets (one copy less)."""
    static_graph: bool = False
    """DDP: an optimisation for models whose graph never changes between steps."""

    def __post_init__(self) -> None:
        require(self.timeout_s >= 1, "distributed.timeout_s", "must be >= 1")
        require(self.node_timeout_s >= 2, "distributed.node_timeout_s", "must be >= 2")
        require(
            not (self.backend is Backend.nccl and self.device is Device.cpu),
            "distributed.backend",
            "nccl needs distributed.device=cuda; use distributed.backend=gloo on CPU",
        )


@dataclass
class TrackerConfig:
    name: TrackerName = TrackerName.none
    """Experiment tracker fed by rank 0 with every metrics.jsonl record."""
    project: str = ""
    """The wandb project or MLflow experiment; empty: the project's name."""
    run_name: str = ""
    """The tracker's run name; empty: the name of output_dir. A resumed run continues the same tracker run."""


@dataclass
class Config:
    output_dir: str = "outputs/run"
    """Where metrics.jsonl, checkpoints/ and final/ go."""
    seed: int = 42
    """Seeds the data order, the initialisation of new heads and dropout (offset by rank)."""
    log_level: LogLevel = LogLevel.info
    """Rank 0's console; the other ranks show warnings and errors only."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every parameter; null (absent): every parameter."""

    def __post_init__(self) -> None:
        require(bool(self.output_dir.strip()), "output_dir", "must not be empty")
        require_finite(self)
        require(
            not (self.checkpoint.async_ and self.distributed.strategy is Strategy.ddp),
            "checkpoint.async",
            "needs distributed.strategy=fsdp2 (a ddp checkpoint is one file that rank 0 writes)",
        )
        require(
            not (self.train.precision is Precision.fp16 and self.distributed.device is Device.cpu),
            "train.precision",
            "fp16 needs CUDA; use train.precision=bf16 or fp32 on CPU",
        )

    def to_yaml(self) -> str:
        tree = OmegaConf.to_container(OmegaConf.structured(self), enum_to_str=True)
        return OmegaConf.to_yaml(OmegaConf.create(renamed(tree, public_key)))
