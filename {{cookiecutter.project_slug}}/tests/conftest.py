"""Shared fixtures: the offline demo assets, and running ``launch.sh`` with real torchrun processes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.constants import MODEL_TYPE

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
# The metric each model type reports besides eval_loss.
METRIC = {
    "text-classification": "eval_accuracy",
    "causal-lm": "eval_perplexity",
    "image-classification": "eval_accuracy",
    "custom": "eval_accuracy",
}[MODEL_TYPE]


def launch_env(nproc: int, **extra: str) -> dict[str, str]:
    """Environment for ``launch.sh``: this interpreter's torchrun first on PATH, the package importable."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{PROJECT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["NPROC_PER_NODE"] = str(nproc)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_launch(
    args: list[str], nproc: int = 2, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PROJECT / "launch.sh"), *args],
        env=launch_env(nproc, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(output_dir: Path) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The offline demo's checkpoint and data, built once per test session."""
    directory = tmp_path_factory.mktemp("demo")
    builder = importlib.import_module(f"{PACKAGE}.demos.{MODEL_TYPE.replace('-', '_')}")
    overrides = [item for item in builder.build(directory) if not item.startswith("output_dir=")]
    return directory, overrides


@pytest.fixture(scope="session")
def trained(demo: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short two-process run on the demo, shared by the tests that inspect its outputs."""
    output_dir = tmp_path_factory.mktemp("run")
    _, overrides = demo
    result = run_launch(
        [*overrides, f"output_dir={output_dir}", "train.epochs=2", "checkpoint.every_steps=5"]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir
