"""Device memory as evaluation records report it: the peak any rank's GPU held since the last report."""

from __future__ import annotations

import torch

from ..parallel.process_group import DistEnv, start_all_reduce_max_cpu, wait_for


def peak_memory(env: DistEnv) -> dict[str, float]:
    """``peak_memory_gib``: the most memory tensors took on one GPU since the previous call (or the
    start), the largest over the ranks; nothing on CPU. A collective on GPUs; resets the peak."""
    if env.device.type != "cuda":
        return {}
    peak = torch.tensor([float(torch.cuda.max_memory_allocated(env.device))], dtype=torch.float64)
    wait_for(start_all_reduce_max_cpu(peak))
    torch.cuda.reset_peak_memory_stats(env.device)
    return {"peak_memory_gib": round(peak.item() / 2**30, 3)}
