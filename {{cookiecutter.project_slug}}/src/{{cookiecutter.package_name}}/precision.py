"""Mixed precision: autocast for bf16/fp16, and a gradient scaler for fp16 only."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from .config import Precision

AUTOCAST_DTYPES = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager:
    if precision is Precision.fp32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    # bf16 has fp32's exponent range and needs no loss scaling; fp16 underflows without it.
    return torch.amp.GradScaler(device.type, enabled=precision is Precision.fp16)
