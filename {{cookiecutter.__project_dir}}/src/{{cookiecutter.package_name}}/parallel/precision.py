"""Mixed precision: autocast for bf16/fp16, a gradient scaler for fp16 only, bf16 only where it is fast."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from ..config import Precision

AUTOCAST_DTYPES = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


def bf16_supported(device: torch.device) -> bool:
    """Whether the hardware computes bf16 itself rather than emulating it (slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)  # Ampere and newer
    try:  # oneDNN's bf16 kernels need AVX-512 (or AMX / ARM's bf16); AVX2-only CPUs emulate it
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def effective_precision(requested: Precision, device: torch.device) -> Precision:
    """The precision a run trains in: bf16 falls back to fp32 where the hardware lacks it."""
    if requested is Precision.bf16 and not bf16_supported(device):
        return Precision.fp32
    return requested


def fallback_warning(device: torch.device) -> str:
    hardware = "GPU (bf16 needs Ampere or newer)" if device.type == "cuda" else "CPU (no AVX-512/AMX bf16)"
    return (
        f"train.precision=bf16, but this {hardware} would only emulate bf16, slower than fp32: "
        "training in fp32 instead; set train.precision=fp32 to silence this warning"
    )


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager:
    if precision is Precision.fp32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    # bf16 has fp32's exponent range and needs no loss scaling; fp16 underflows without it.
    return torch.amp.GradScaler(device.type, enabled=precision is Precision.fp16)
