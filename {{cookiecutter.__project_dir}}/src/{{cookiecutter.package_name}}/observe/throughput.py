"""Training speed as metrics.jsonl reports it: samples/s, tokens/s, the share of time spent waiting for
data, and the model FLOPs utilisation (mfu) where the device's peak is known.

Everything is counted on the host, so measuring adds no device synchronisation; the counts of all ranks
travel in the all-reduce that logging does anyway.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..config import Precision

# Dense peak TFLOP/s of one device (bf16/fp16 tensor cores, fp32 without TF32), from the vendors' data
# sheets. The first name contained in torch.cuda.get_device_name() wins, so longer names come first.
PEAK_TFLOPS = {
    "H100 PCIe": (756.0, 51.0),
    "H100": (989.0, 67.0),
    "H200": (989.0, 67.0),
    "H800": (989.0, 67.0),
    "B200": (2250.0, 80.0),
    "A100": (312.0, 19.5),
    "A800": (312.0, 19.5),
    "L40S": (362.0, 91.6),
    "L4": (121.0, 30.3),
    "RTX 4090": (165.2, 82.6),
    "RTX 3090": (71.0, 35.6),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
}


def device_peak_flops(device: torch.device, precision: Precision, configured_tflops: float) -> float:
    """Peak FLOP/s of one device in ``precision``: the configured value, else the table's; 0 if unknown."""
    if configured_tflops:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    for known, (half, single) in PEAK_TFLOPS.items():
        if known in name:
            return (single if precision is Precision.fp32 else half) * 1e12
    return 0.0


def training_flops_per_token(model: nn.Module) -> float:
    """Per parameter that multiplies each position: 2 in the forward pass, 2 for the gradient of its
    input, and 2 more for its own gradient where it trains (6 in all; 4 for LoRA's frozen base). Embedding
    tables are look-ups, not products, and count only where the output layer reuses them (tied weights).
    Recomputation under gradient checkpointing is not counted: mfu counts the model's FLOPs."""
    embeddings = [module.weight for module in model.modules() if isinstance(module, nn.Embedding)]
    looked_up = {id(weight) for weight in embeddings}
    multiplying = [p for p in model.parameters() if id(p) not in looked_up]
    get_output = getattr(model, "get_output_embeddings", None)  # transformers models have one
    output_weight = getattr(get_output(), "weight", None) if callable(get_output) else None
    if isinstance(output_weight, nn.Parameter) and id(output_weight) in looked_up:
        multiplying.append(output_weight)
    return sum((6.0 if p.requires_grad else 4.0) * p.numel() for p in multiplying)


class Throughput:
    """Counts since the previous reading. Evaluation and checkpoints run inside ``paused()``."""

    def __init__(self, flops_per_token: float = 0.0, peak_flops: float = 0.0) -> None:
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.restart()

    def restart(self, now: float | None = None) -> None:
        """Count from now (or ``now``) on, forgetting what was counted."""
        now = time.perf_counter() if now is None else now
        self.samples, self.tokens, self.waited, self.excluded, self.since = 0, 0, 0.0, 0.0, now

    def add(self, samples: int, tokens: int) -> None:
        """``samples`` of the whole job (they are equal on every rank), ``tokens`` of this rank."""
        self.samples += samples
        self.tokens += tokens

    @contextmanager
    def waiting_for_data(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - start

    @contextmanager
    def paused(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - start

    def local_counts(self) -> list[float]:
        """This rank's tokens and data wait, to be summed over ranks and passed to ``read``."""
        return [float(self.tokens), self.waited]

    def read(self, tokens: float, waited: float, world_size: int) -> dict[str, float]:
        """The rates since the previous reading, from the job's summed ``tokens`` and ``waited``."""
        now = time.perf_counter()
        elapsed = max(now - self.since - self.excluded, 1e-9)
        rates = {
            "samples_per_s": round(self.samples / elapsed, 2),
            "tokens_per_s": round(tokens / elapsed, 1),
            "data_wait_share": round(min(waited / world_size / elapsed, 1.0), 4),
        }
        if self.flops_per_token and self.peak_flops:
            mfu = tokens * self.flops_per_token / elapsed / (self.peak_flops * world_size)
            rates["mfu"] = float(f"{mfu:.3g}")  # significant digits: a tiny model's mfu never reads as 0
        self.restart(now)
        return rates
