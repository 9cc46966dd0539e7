"""launch.sh of GPU projects: the generated launch tests that only apply with GPUs run here (fake torchrun).

The slow tests run the CPU projects' whole suites; this runs the GPU-only launch checks (one process per
visible device, too many processes refused, the rendered GPU count as default) of GPU renders.
"""

from __future__ import annotations

import os
import sys

import pytest
from template_helpers import VENV_BIN, describe, run


@pytest.mark.parametrize(("gpus", "nodes"), [("1", "1"), ("8", "4")])
def test_gpu_project_launch_checks_pass(bake_ok, gpus: str, nodes: str) -> None:
    project = bake_ok(
        model_type="custom", gpus_per_node=gpus, num_nodes=nodes, backend="nccl", precision="bf16"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(project.path / "src")
    proc = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_launch_script.py"],
        cwd=project.path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, describe(proc)
    assert "skipped" not in proc.stdout, describe(proc)  # the GPU-only checks ran
