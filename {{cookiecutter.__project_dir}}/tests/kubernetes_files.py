"""The rendered Kubernetes files, parsed once for the tests of each, and launch.sh run as a pod runs it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml
from conftest import PACKAGE, PROJECT

LAUNCH = (PROJECT / "launch.sh").read_text(encoding="utf-8")
RENDERED_GPUS = int(re.search(r"RENDERED_GPUS_PER_NODE=(\d+)", LAUNCH).group(1))
RENDERED_NODES = int(re.search(r"RENDERED_NUM_NODES=(\d+)", LAUNCH).group(1))
PROCESSES_PER_NODE = RENDERED_GPUS or 1


def manifest(name: str) -> dict:
    return yaml.safe_load((PROJECT / "k8s" / name).read_text(encoding="utf-8"))


TRAINJOB = manifest("trainjob.yaml")
PYTORCHJOB = manifest("pytorchjob.yaml")
CLAIM, FILES_POD = yaml.safe_load_all((PROJECT / "k8s" / "storage.yaml").read_text(encoding="utf-8"))


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def overrides_of(args: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in args)


def launch_in_pod(tmp_path: Path, pod_env: dict[str, str], args: list[str]) -> list[str]:
    """torchrun's arguments as launch.sh builds them in a pod with `pod_env` (the config pre-check
    passes: a stand-in `python` prints the launcher's arguments)."""
    (tmp_path / "python").write_text(
        '#!/usr/bin/env bash\nif [[ "$2" == *.launcher ]]; then shift 2; printf "%s\\n" "$@"; fi\n'
    )
    (tmp_path / "python").chmod(0o755)
    ours = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RUN_ID")
    env = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith(("PET_", "CUDA_"))}
    if RENDERED_GPUS:  # what the device plugin exposes
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(RENDERED_GPUS)))
    env.update(pod_env, PATH=f"{tmp_path}{os.pathsep}{env['PATH']}")
    result = subprocess.run(
        [str(PROJECT / "launch.sh"), *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def assert_torchrun_meets_on(
    torchrun: list[str], node: int, endpoint: str, env: dict[str, str], args: list[str]
) -> None:
    """torchrun's arguments on node `node`: a process per GPU, restarts, and a multi-node job's c10d
    rendezvous on `endpoint`, hosted by node 0; then the package with the job's overrides."""
    assert f"--nproc-per-node={PROCESSES_PER_NODE}" in torchrun
    assert f"--max-restarts={env['MAX_RESTARTS']}" in torchrun
    if RENDERED_NODES == 1:
        assert "--standalone" in torchrun
    else:
        for expected in [f"--nnodes={RENDERED_NODES}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                         f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}"]:  # fmt: skip
            assert expected in torchrun
    assert torchrun[torchrun.index("-m") + 1 :] == [PACKAGE, *args]
