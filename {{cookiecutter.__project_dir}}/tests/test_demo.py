"""``python -m <package>.demo``: the same bytes on every build, no blank output lines, and overrides that
train where there is no CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, PROJECT

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    Device,
    load_config,
)
from {{ cookiecutter.package_name }}.demo import (
    cpu_overrides,
)

GPU_RUN = ["distributed.device=cuda", "distributed.backend=nccl", "train.precision=bf16"]
CPU_RUN = ["distributed.device=cpu", "distributed.backend=gloo", "train.precision=fp32"]


def test_a_gpu_run_without_cuda_moves_to_the_cpu_with_gloo() -> None:
    overrides = cpu_overrides(load_config(GPU_RUN), cuda_available=False)
    assert overrides == ["distributed.device=cpu", "distributed.backend=gloo"]
    assert load_config([*GPU_RUN, *overrides]).distributed.device is Device.cpu


def test_fp16_becomes_fp32_on_the_cpu() -> None:
    fp16 = [*GPU_RUN, "train.precision=fp16"]
    overrides = cpu_overrides(load_config(fp16), cuda_available=False)
    assert overrides[-1] == "train.precision=fp32"
    load_config([*fp16, *overrides])  # valid: fp16 on the CPU would be refused


@pytest.mark.parametrize(
    ("run", "cuda_available"),
    [(GPU_RUN, True), (CPU_RUN, False)],
)
def test_runs_that_can_train_here_keep_their_settings(run: list[str], cuda_available: bool) -> None:
    assert cpu_overrides(load_config(run), cuda_available) == []


def build_demo(cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.demo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


@pytest.mark.slow
def test_two_builds_write_the_same_bytes_and_no_blank_lines(tmp_path: Path) -> None:
    first, second = build_demo(tmp_path / "first"), build_demo(tmp_path / "second")
    for build in (first, second):
        assert build.returncode == 0, build.stderr
        output = build.stdout.splitlines() + build.stderr.splitlines()
        assert output and all(line.strip() for line in output), output
    assert first.stdout == second.stdout
    built, rebuilt = files(tmp_path / "first" / "demo"), files(tmp_path / "second" / "demo")
    assert "overrides.txt" in built and any(name.startswith("model/") for name in built)
    assert sorted(built) == sorted(rebuilt)
    assert [name for name in built if built[name] != rebuilt[name]] == []  # every file, byte for byte
    for name, content in built.items():  # data, configs and overrides: no empty lines either
        if name.endswith((".jsonl", ".txt", ".json")):
            lines = content.decode("utf-8").splitlines()
            assert all(line.strip() for line in lines), f"{name} has a blank line"
