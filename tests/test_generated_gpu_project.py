"""GPU projects: their fast tests pass on a machine without CUDA, GPU-only launch checks included.

The slow tests run the CPU projects' whole suites; this runs the fast suite of GPU renders: the tests
move themselves to CPU/gloo where there is no CUDA, and the launch checks that only apply with GPUs (one
process per visible device, too many processes refused, the rendered GPU count) run with a fake torchrun.
"""

from __future__ import annotations

import os
import sys

import pytest
from template_helpers import LONG_NAME, VENV_BIN, describe, run

# The text-classification render is also the lora render whose fast tier the template runs (see
# test_generated_project_slow.py), under a 60-character name in a shell without OMP_NUM_THREADS.
RENDERS = [
    {"model_type": "custom", "gpus_per_node": "1", "num_nodes": "1", "precision": "bf16"},
    {
        "model_type": "text-classification",
        "gpus_per_node": "8",
        "num_nodes": "4",
        "precision": "fp16",
        "finetune": "lora",
        "project_name": LONG_NAME,
    },
]


@pytest.mark.expected_s(50)
@pytest.mark.parametrize("answers", RENDERS, ids=["custom-1-1-bf16", "text-classification-8-4-fp16-lora"])
def test_gpu_project_fast_tests_pass_on_a_cpu_machine(bake_ok, answers: dict[str, str]) -> None:
    project = bake_ok(backend="nccl", **answers)
    if "project_name" in answers:
        assert len(project.package) == len(LONG_NAME) == 60
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "OMP_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(project.path / "src")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    proc = run(command, cwd=project.path, env=env, timeout=900)
    assert proc.returncode == 0, describe(proc)
    assert "skipped" not in proc.stdout, describe(proc)  # the GPU-only launch checks ran too
