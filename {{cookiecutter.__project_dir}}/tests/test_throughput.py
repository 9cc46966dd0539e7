"""Speed reporting and the precision a run trains in: rates from host counts, FLOPs per token, peaks."""

from __future__ import annotations

import platform
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from {{ cookiecutter.package_name }}.config import (
    DistributedConfig,
    Precision,
)
from {{ cookiecutter.package_name }}.observe import (
    throughput as throughput_module,
)
from {{ cookiecutter.package_name }}.observe.memory import peak_memory
from {{ cookiecutter.package_name }}.observe.throughput import (
    Throughput,
    device_peak_flops,
    training_flops_per_token,
)
from {{ cookiecutter.package_name }}.parallel import (
    precision as precision_module,
)
from {{ cookiecutter.package_name }}.parallel.ddp import (
    has_training_state_buffers,
    wrap_ddp,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

CPU = torch.device("cpu")


class TinyLM(nn.Module):
    """An embedding table (64 x 8), one 8 x 8 layer, and an output layer tied to the table or not."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 8)
        self.layer = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 64, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_output_embeddings(self) -> nn.Module:
        return self.head


def test_flops_per_token_count_products_not_look_ups() -> None:
    assert training_flops_per_token(TinyLM(tied=False)) == 6 * (8 * 8 + 64 * 8)
    assert training_flops_per_token(TinyLM(tied=True)) == 6 * (8 * 8 + 64 * 8)  # the table, as a product
    mlp = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    assert training_flops_per_token(mlp) == 6 * (4 * 3 + 3 + 3 * 2 + 2)
    mlp[0].requires_grad_(False)  # frozen, as LoRA's base: no gradient of its own to compute
    assert training_flops_per_token(mlp) == 4 * (4 * 3 + 3) + 6 * (3 * 2 + 2)


def test_rates_come_from_the_summed_counts_and_exclude_pauses(monkeypatch) -> None:
    clock = iter([100.0, 101.0, 103.0, 104.0])
    monkeypatch.setattr(throughput_module.time, "perf_counter", lambda: next(clock))
    meter = Throughput(flops_per_token=10.0, peak_flops=1000.0)  # starts at 100
    meter.add(samples=32, tokens=500)
    with meter.paused():  # 101 -> 103: not training time
        pass
    assert meter.local_counts() == [500.0, 0.0]
    rates = meter.read(tokens=900.0, waited=0.5, world_size=2)  # at 104: 2 s of training
    assert rates == {
        "samples_per_s": 16.0,
        "tokens_per_s": 450.0,
        "data_wait_share": 0.125,  # 0.25 s per rank of 2 s
        "mfu": 450.0 * 10.0 / (1000.0 * 2),
    }


def test_a_tiny_models_mfu_keeps_its_significant_digits(monkeypatch) -> None:
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(throughput_module.time, "perf_counter", lambda: next(clock))
    meter = Throughput(flops_per_token=6.0, peak_flops=1e12)  # a small MLP against a 1 TFLOP/s peak
    assert meter.read(tokens=1234.0, waited=0.0, world_size=1)["mfu"] == 7.4e-09


def test_no_mfu_without_a_known_peak() -> None:
    assert device_peak_flops(CPU, Precision.bf16, configured_tflops=0.0) == 0.0
    assert device_peak_flops(CPU, Precision.bf16, configured_tflops=2.5) == 2.5e12
    assert "mfu" not in Throughput().read(tokens=1.0, waited=0.0, world_size=1)


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", Precision.bf16, 989.0),
        ("NVIDIA H100 PCIe", Precision.bf16, 756.0),
        ("NVIDIA A100-SXM4-40GB", Precision.fp32, 19.5),
        ("Tesla T4", Precision.fp16, 65.0),
        ("Some Future GPU", Precision.bf16, 0.0),
    ],
)
def test_gpu_peaks_by_name(monkeypatch, name: str, precision: Precision, tflops: float) -> None:
    monkeypatch.setattr(throughput_module.torch.cuda, "get_device_name", lambda device: name)
    assert device_peak_flops(torch.device("cuda", 0), precision, 0.0) == tflops * 1e12


def test_bf16_falls_back_to_fp32_where_the_hardware_lacks_it(monkeypatch) -> None:
    monkeypatch.setattr(precision_module, "bf16_supported", lambda device: False)
    assert precision_module.effective_precision(Precision.bf16, CPU) is Precision.fp32
    assert precision_module.effective_precision(Precision.fp32, CPU) is Precision.fp32
    assert "train.precision=fp32" in precision_module.fallback_warning(CPU)
    monkeypatch.setattr(precision_module, "bf16_supported", lambda device: True)
    assert precision_module.effective_precision(Precision.bf16, CPU) is Precision.bf16


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {
        flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":")[1].split()
    }


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not cpu_flags(), reason="x86 flags")
def test_bf16_support_follows_this_cpus_instruction_set() -> None:
    """oneDNN computes bf16 with AVX-512 (BW, VL, DQ) or AMX; a CPU with neither would only emulate it."""
    flags = cpu_flags()
    native = {"avx512bw", "avx512vl", "avx512dq"} <= flags or "amx_bf16" in flags
    assert precision_module.bf16_supported(CPU) is native


@pytest.mark.parametrize(
    ("capability", "native"), [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_bf16_on_gpus_from_ampere_on(monkeypatch, capability: tuple[int, int], native: bool) -> None:
    monkeypatch.setattr(precision_module.torch.cuda, "get_device_capability", lambda device: capability)
    assert precision_module.bf16_supported(torch.device("cuda", 0)) is native


class WithConstantBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.register_buffer("position_ids", torch.arange(4), persistent=False)


def test_ddp_broadcasts_buffers_only_where_they_hold_training_state() -> None:
    assert has_training_state_buffers(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    assert not has_training_state_buffers(WithConstantBuffer())
    assert not has_training_state_buffers(nn.Linear(4, 4))


def test_ddp_is_told_which_buffers_to_sync_without_a_deprecation_warning(tmp_path) -> None:
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=CPU)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            batch_norm = wrap_ddp(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), env, DistributedConfig())
            constant = wrap_ddp(WithConstantBuffer(), env, DistributedConfig())
        assert batch_norm.broadcast_buffers and not constant.broadcast_buffers
    finally:
        dist.destroy_process_group()


def test_peak_memory_is_reported_on_gpus_only_and_reset_each_time(monkeypatch) -> None:
    assert peak_memory(DistEnv(rank=0, local_rank=0, world_size=1, device=CPU)) == {}
    peaks, resets = [3 * 2**30, 2**29], []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks.pop(0))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    gpu = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    assert peak_memory(gpu) == {"peak_memory_gib": 3.0}
    assert peak_memory(gpu) == {"peak_memory_gib": 0.5}  # since the previous report, not since the start
    assert resets == [gpu.device, gpu.device]
