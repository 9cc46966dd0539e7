"""GPU projects: their fast tests pass on a machine without CUDA, GPU-only launch checks included.

The slow tests run the CPU projects' whole suites; this runs the fast suite of GPU renders: the tests
move themselves to CPU/gloo where there is no CUDA, and the launch checks that only apply with GPUs (one
process per visible device, too many processes refused, the rendered GPU count) run with a fake torchrun.
"""

from __future__ import annotations

import os
import sys

import pytest
from template_helpers import VENV_BIN, describe, run


@pytest.mark.parametrize(
    ("model_type", "gpus", "nodes", "precision"),
    [("custom", "1", "1", "bf16"), ("text-classification", "8", "4", "fp16")],
)
def test_gpu_project_fast_tests_pass_on_a_cpu_machine(bake_ok, model_type, gpus, nodes, precision) -> None:
    project = bake_ok(
        model_type=model_type, gpus_per_node=gpus, num_nodes=nodes, backend="nccl", precision=precision
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(project.path / "src")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    proc = run(command, cwd=project.path, env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert "skipped" not in proc.stdout, describe(proc)  # the GPU-only launch checks ran too
