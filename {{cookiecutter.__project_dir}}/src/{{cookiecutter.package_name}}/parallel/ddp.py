"""Wrapping the model for DDP and getting the plain module back for saving and evaluation."""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..config import DistributedConfig
from ..config.validation import ConfigError
from .process_group import DistEnv, is_distributed


def wrap_ddp(model: nn.Module, env: DistEnv, config: DistributedConfig) -> nn.Module:
    """Move to this rank's device and wrap; weights must be loaded before, DDP broadcasts rank 0's."""
    model.to(env.device)
    if not is_distributed():
        return model
    return DistributedDataParallel(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        find_unused_parameters=config.find_unused_parameters,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        static_graph=config.static_graph,
        **_buffer_sync(has_training_state_buffers(model)),
    )


def _buffer_sync(before_each_forward: bool) -> dict[str, Any]:
    """DDP's option to re-send rank 0's buffers before each forward, under its name in this torch: 2.13
    renamed ``broadcast_buffers`` to ``forward_sync_buffers`` and warns on every rank at the old one."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": before_each_forward}
    return {"broadcast_buffers": before_each_forward}


def has_training_state_buffers(model: nn.Module) -> bool:
    """Whether the model has buffers that are part of its state (BatchNorm's running statistics): DDP
    then copies rank 0's to the others before every forward. Transformers' buffers (position ids,
    attention masks) are constants kept out of the state dict, and re-sending them each step costs
    as much as a layer's forward on a small model."""
    return bool(state_buffers(model))


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """transformers' gradient checkpointing, always the non-reentrant variant: it needs no input that
    requires a gradient (a frozen embedding under LoRA) and works with DDP's no_sync, unused parameters
    where the reentrant one fails."""
    non_reentrant = {"use_reentrant": False}
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"model.gradient_checkpointing=true: {type(model).__name__} does not support it "
            "(transformers models offer gradient_checkpointing_enable); run with "
            "model.gradient_checkpointing=false"
        )
    transformers_model: Any = model
    if hasattr(model, "activation_checkpointing_enable"):  # its newer name, without the deprecation
        transformers_model.activation_checkpointing_enable(activation_checkpointing_kwargs=non_reentrant)
    else:
        transformers_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)


def trainable_share(model: nn.Module) -> str:
    """``trainable 0.59 M of 124 M (0.47 %)``: the parameters the optimizer updates, of all (each once)."""
    parameters = list(model.parameters())
    total = sum(p.numel() for p in parameters)
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    share = 100 * trainable / total if total else 0.0
    return f"trainable {trainable / 1e6:.3g} M of {total / 1e6:.3g} M ({share:.2f} %)"


def compile_model(model: nn.Module) -> nn.Module:
    """torch.compile around the DDP wrapper, so DDP's bucketing splits the graph where all-reduces start
    and they overlap the backward pass; compiling the bare module first would hide its parameters."""
    return cast(nn.Module, torch.compile(model))


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module, without DDP's ``module.`` or torch.compile's ``_orig_mod.`` prefixes."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = cast(nn.Module, model.module)
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = cast(nn.Module, model._orig_mod)
        else:
            return model


def skip_gradient_sync(model: nn.Module, skip: bool) -> AbstractContextManager:
    """DDP's ``no_sync`` on the micro-steps of an accumulation window that are not its last."""
    ddp = getattr(model, "_orig_mod", model)  # the DDP wrapper inside torch.compile's
    if skip and isinstance(ddp, DistributedDataParallel):
        return ddp.no_sync()
    return nullcontext()


def state_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The buffers that are part of the model's state (BatchNorm's running statistics), by name."""
    saved = unwrap(model).state_dict().keys()
    return [(name, buffer) for name, buffer in unwrap(model).named_buffers() if name in saved]


def sync_state_buffers(model: nn.Module, world_size: int) -> None:
    """Make the ranks' state buffers equal before they are evaluated or saved.

    After the last step each rank's running statistics have seen its own last batch. Floating buffers
    are averaged, so they reflect every rank's data; counters (BatchNorm's num_batches_tracked) are
    equal already and stay rank 0's. A collective when there are state buffers; a no-op otherwise.
    """
    if not is_distributed():
        return
    for _, buffer in state_buffers(model):
        if buffer.is_floating_point():
            torch.distributed.all_reduce(buffer)
            buffer.div_(world_size)
        else:
            torch.distributed.broadcast(buffer, src=0)


def parameter_checksums(model: nn.Module) -> list[tuple[str, float, float]]:
    """(name, sum, sum of squares) in float64 of every parameter and state buffer: equal lists mean
    equal replicas."""
    checksums = []
    tensors = [*unwrap(model).named_parameters(), *state_buffers(model)]
    for name, tensor in tensors:
        values = tensor.detach().double()
        checksums.append((name, values.sum().item(), values.square().sum().item()))
    return checksums
