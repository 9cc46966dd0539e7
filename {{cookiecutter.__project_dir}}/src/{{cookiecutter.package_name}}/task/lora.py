"""LoRA fine-tuning (the ``lora`` config section): peft's adapters on a Hugging Face model's linear layers.

Only the adapters and the model's head (a classification head, new at fine-tuning) train; the pretrained
body stays frozen. ``add_adapters`` runs before the model is wrapped (setup.build_training_state), so DDP
and FSDP2 see the adapters; checkpoints then hold the trainable parameters only
(parallel/training_state.py), and ``final/`` the merged model plus ``final/adapter/`` (``save_final``).

peft is imported inside the functions: a project that trains every parameter does not depend on it.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import LoraConfig
from ..config.validation import ConfigError
from ..parallel import liveness
from .hugging_face import head_modules
from .spec import Task, TaskData

ALL_LINEAR = "all-linear"
ADAPTER_DIR = "adapter"


def target_modules(config: LoraConfig) -> str | list[str]:
    """peft's ``all-linear`` as it is, or the comma-separated names as a list (each matches a module whose
    name ends with it)."""
    names = config.target_modules.replace(",", " ").split()
    return ALL_LINEAR if names == [ALL_LINEAR] else names


def add_adapters(model: nn.Module, config: LoraConfig, seed: int) -> nn.Module:
    """The model with LoRA adapters (a peft ``PeftModel``), its head trained whole and left without
    adapters. The adapters are drawn from ``seed`` alone, so every rank draws the same ones (FSDP2 does
    not broadcast rank 0's, as DDP does)."""
    import peft

    head = head_modules(model)
    adapters = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=target_modules(config),
        exclude_modules=head or None,
        modules_to_save=head or None,
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # The head is excluded from the targets in case they name it; peft warns where they do not.
        warnings.filterwarnings("ignore", "You have passed exclude_modules")
        # GPT-2's Conv1D layers store weights transposed, which peft handles, warning on every rank.
        warnings.filterwarnings("ignore", "fan_in_fan_out is set to False but the target module is")
        # peft reads transformers' deprecated name for it (a warning on every rank, of no use to users).
        warnings.filterwarnings("ignore", ".is_gradient_checkpointing. is deprecated", FutureWarning)
        torch.manual_seed(seed)
        try:
            return peft.get_peft_model(model, adapters)
        except ValueError as error:  # target modules the model lacks, or none left
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(
                f"lora.target_modules={config.target_modules!r}: {reason[:300]}; name modules of "
                f"{type(model).__name__}, or use {ALL_LINEAR}"
            ) from None


def is_adapted(model: nn.Module) -> bool:
    """Whether the model carries peft adapters (peft is imported only where a run adds them)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def merged_copy(model: nn.Module) -> nn.Module:
    """The pretrained model class with the adapters merged into its weights, on the host, for ``final/``;
    ``model`` itself is left as it trained. The merge adds each adapter's update to its base weight in
    place, so those weights are copied; every other tensor is shared (or copied to the host from a GPU)."""
    from peft.tuners.lora import LoraLayer

    merged_into = {
        id(module.get_base_layer().weight) for module in model.modules() if isinstance(module, LoraLayer)
    }
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        host = tensor.detach().to("cpu", copy=id(tensor) in merged_into)
        is_parameter = isinstance(tensor, nn.Parameter)
        memo[id(tensor)] = nn.Parameter(host, requires_grad=tensor.requires_grad) if is_parameter else host
    return copy.deepcopy(model, memo).merge_and_unload()  # type: ignore[operator]


def save_final(task: Task, model: nn.Module, data: TaskData, directory: Path) -> None:
    """``final/``: the model type's own save of the model; of an adapted one, the merged model, and in
    ``final/adapter/`` the adapter alone (with the head), loadable with peft on top of the base model,
    beside the fine-tuned model's config (its labels) and preprocessor, which predict reads."""
    liveness.ensure_not_cut_off()
    if not is_adapted(model):
        task.save_final(model, data, directory)
        return
    adapted: Any = model
    adapter = directory / ADAPTER_DIR
    adapted.save_pretrained(adapter)  # adapter_config.json, adapter_model.safetensors
    (adapter / "README.md").unlink(missing_ok=True)  # peft's blank model card
    merged: Any = merged_copy(model)
    task.save_final(merged, data, directory)
    merged.config.save_pretrained(adapter)
    if data.preprocessor is not None:
        data.preprocessor.save_pretrained(adapter)
