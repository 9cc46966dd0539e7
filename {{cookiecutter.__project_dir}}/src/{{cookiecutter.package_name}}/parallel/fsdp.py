"""distributed.strategy=fsdp2: parameters, gradients and optimizer state sharded over the processes.

``fully_shard`` goes on each transformer block, then on the root: a block's parameters are gathered just
before its forward (and backward) and freed after, so a rank holds one block in full at a time and a
1/world-size share of everything else. Parameters are kept in fp32 and gathered in the training precision
(``MixedPrecisionPolicy``), gradients are reduced in fp32; no autocast. Adapters (LoRA) are part of the
model the task builds, so they are sharded with the blocks they sit in.

With one process and no process group (``python -m <package>``) there is nothing to shard over: the model
stays whole and trains under autocast, and its checkpoints are still sharded ones, which any number of
processes can resume.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from ..config import CheckpointConfig, DistributedConfig, Precision
from ..config.validation import ConfigError
from .ddp import state_buffers, unwrap
from .precision import AUTOCAST_DTYPES, autocast, grad_scaler
from .process_group import DistEnv, gather_objects, is_distributed
from .sharded_checkpoint import ShardedDirectory


def block_classes(model: nn.Module, fsdp_wrap: str) -> set[str]:
    """The class names of the blocks to shard one by one: ``distributed.fsdp_wrap``, else the model's
    ``_no_split_modules`` (Hugging Face's list of blocks never to split), else the class of the layers
    of its block list (an ``nn.ModuleList`` of modules of one class)."""
    if fsdp_wrap.strip():
        return {name.strip() for name in fsdp_wrap.split(",") if name.strip()}
    for module in model.modules():
        declared = getattr(module, "_no_split_modules", None)
        if declared:
            return set(declared)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            kinds = {type(layer).__name__ for layer in module}
            if len(kinds) == 1:
                return kinds
    return set()


def shard_blocks(model: nn.Module, fsdp_wrap: str) -> list[nn.Module]:
    """The modules ``fully_shard`` goes on before the root, innermost first. A block that shares a
    parameter with the rest of the model (tied embeddings) stays with the root, as FSDP2 requires."""
    classes = block_classes(model, fsdp_wrap)
    found = {type(module).__name__ for module in model.modules()}
    if not classes & found:
        if fsdp_wrap.strip():
            problem = f"no module of class {', '.join(sorted(classes))} in {type(model).__name__}"
        else:
            problem = f"{type(model).__name__} declares no blocks (_no_split_modules) and has no block list"
        raise ConfigError(
            f"distributed.fsdp_wrap: {problem}; name the class of its repeated blocks with "
            "distributed.fsdp_wrap=<class name>, or train it with distributed.strategy=ddp"
        )
    uses: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        uses[id(parameter)] = uses.get(id(parameter), 0) + 1
    blocks = []
    for module in reversed(list(model.modules())):  # children before their parents
        if type(module).__name__ not in classes or module is model:
            continue
        inside: dict[int, int] = {}
        for _, parameter in module.named_parameters(remove_duplicate=False):
            inside[id(parameter)] = inside.get(id(parameter), 0) + 1
        if all(uses[key] == count for key, count in inside.items()):
            blocks.append(module)
    return blocks


def meta_copy(model: nn.Module) -> nn.Module:
    """The model's structure with its parameters on the meta device (no memory), its buffers copied:
    filled with the gathered weights, it is what ``final/`` saves (tied weights stay tied)."""
    memo: dict[int, object] = {}
    for parameter in model.parameters():
        memo[id(parameter)] = nn.Parameter(
            torch.empty_like(parameter, device="meta"), requires_grad=parameter.requires_grad
        )
    return copy.deepcopy(model, memo)


def filled(skeleton: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """``skeleton`` with every parameter (and state buffer) taken from a full state dict."""
    first_name = {}
    for name, parameter in skeleton.named_parameters():
        first_name[id(parameter)] = name
    replaced: dict[int, nn.Parameter] = {}
    for module in skeleton.modules():
        for key, meta in list(module._parameters.items()):
            if meta is None:
                continue
            if id(meta) not in replaced:
                full = weights[first_name[id(meta)]]
                replaced[id(meta)] = nn.Parameter(full, requires_grad=meta.requires_grad)
            module._parameters[key] = replaced[id(meta)]
    for name, buffer in state_buffers(skeleton):
        buffer.copy_(weights[name])
    return skeleton


class Sharded:
    """FSDP2 behind the strategy seam of parallel/strategy.py."""

    equal_forwards = True
    """Every forward gathers parameters with the other ranks: evaluation pads the ranks with fewer batches."""

    def __init__(self, env: DistEnv, config: DistributedConfig, precision: Precision) -> None:
        self.env, self.config, self.precision = env, config, precision
        self.sharded = is_distributed()
        self.skeleton: nn.Module | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        """Shard the model, still on the host: each ``fully_shard`` moves one block to the device and
        keeps this rank's shard of it, so no rank ever holds the whole model on its GPU."""
        if not self.sharded:
            return model.to(self.env.device)
        blocks = shard_blocks(model, self.config.fsdp_wrap)
        self.skeleton = meta_copy(model) if self.env.is_main else None
        mesh = init_device_mesh(self.env.device.type, (self.env.world_size,))
        low = AUTOCAST_DTYPES.get(self.precision)
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model

    def autocast(self) -> AbstractContextManager:
        return nullcontext() if self.sharded else autocast(self.precision, self.env.device)

    def grad_scaler(self) -> torch.amp.GradScaler:
        if self.sharded and self.precision is Precision.fp16:  # every rank skips an inf step alike
            return ShardedGradScaler(self.env.device.type)
        return grad_scaler(self.precision, self.env.device)

    def skip_gradient_sync(self, model: nn.Module, skip: bool) -> AbstractContextManager:
        """No reduce-scatter on the micro-steps of an accumulation window but its last: each rank keeps
        its blocks' unsharded gradients until then."""
        root = unwrap(model)
        if isinstance(root, FSDPModule):
            root.set_requires_gradient_sync(not skip)
        return nullcontext()

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole gradient: each rank's shards' norms combined across ranks."""
        parameters = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
        return total

    def verify(self, model: nn.Module) -> str:
        """Each parameter exists once, split over the ranks: no replicas to compare. What every rank must
        hold alike is checked instead: the same parameters (names, full shapes) and state buffers."""
        if not self.sharded:
            return "one process: the model is whole, nothing to compare"
        mine: list[tuple[str, object]] = [
            (name, tuple(p.shape)) for name, p in unwrap(model).named_parameters()
        ]
        mine += [(name, b.double().sum().item()) for name, b in state_buffers(model)]
        for rank, theirs in enumerate(gather_objects(mine, self.env)):
            differing = [a[0] for a, b in zip(mine, theirs, strict=True) if a != b]
            if differing:
                raise RuntimeError(f"rank {rank} holds a different {differing[0]} than rank {self.env.rank}")
        return f"parameters sharded over {self.env.world_size} rank(s); the same shapes and buffers on each"

    @contextmanager
    def full_model(self, model: nn.Module) -> Iterator[nn.Module | None]:
        """A collective: the trained model, whole, on rank 0 (None elsewhere), for ``final/``. The
        gathered fp32 weights go to host memory one tensor at a time."""
        if not self.sharded:
            yield unwrap(model)
            return
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights: Any = get_model_state_dict(unwrap(model), options=options)
        yield filled(self.skeleton, weights) if self.skeleton is not None else None

    def checkpoint_layout(self, config: CheckpointConfig) -> ShardedDirectory:
        return ShardedDirectory(self.env, asynchronous=config.async_)
