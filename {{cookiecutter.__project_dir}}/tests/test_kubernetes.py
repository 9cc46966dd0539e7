"""k8s/pytorchjob.yaml, k8s/storage.yaml and the Dockerfile: the manifests parse and carry the answers
(pods, processes and GPUs per pod), every pod mounts the one volume that holds output_dir, launch.sh builds
the right torchrun command line in the environment the training operator gives each pod, and the
Dockerfile installs this project on a CUDA PyTorch image (slim Python with the CPU build of torch for a CPU
project) in layers that a code change does not re-download, as an unprivileged user, with launch.sh as the
entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import PACKAGE, PROJECT

LAUNCH = (PROJECT / "launch.sh").read_text(encoding="utf-8")
RENDERED_GPUS = int(re.search(r"RENDERED_GPUS_PER_NODE=(\d+)", LAUNCH).group(1))
RENDERED_NODES = int(re.search(r"RENDERED_NUM_NODES=(\d+)", LAUNCH).group(1))
JOB = yaml.safe_load((PROJECT / "k8s" / "pytorchjob.yaml").read_text(encoding="utf-8"))
CLAIM, FILES_POD = yaml.safe_load_all((PROJECT / "k8s" / "storage.yaml").read_text(encoding="utf-8"))
NAME = JOB["metadata"]["name"]
REPLICAS = JOB["spec"]["pytorchReplicaSpecs"]
POD = REPLICAS["Master"]["template"]["spec"]
CONTAINER = POD["containers"][0]
OPERATOR_PORT = 23456  # the operator's MASTER_PORT: the container port named pytorchjob-port


def mount_of(volume_name: str) -> str:
    return next(m["mountPath"] for m in CONTAINER["volumeMounts"] if m["name"] == volume_name)


def test_one_pod_per_node_restarted_on_failure() -> None:
    assert (JOB["apiVersion"], JOB["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", NAME) and len(NAME) <= 48
    assert REPLICAS["Master"]["replicas"] == 1
    assert sum(spec["replicas"] for spec in REPLICAS.values()) == RENDERED_NODES
    assert set(REPLICAS) == ({"Master", "Worker"} if RENDERED_NODES > 1 else {"Master"})
    for spec in REPLICAS.values():
        # Exit 75 (stopped after a checkpoint) must restart the pod; ExitCode would call it permanent.
        assert spec["restartPolicy"] == "OnFailure"
        assert spec["template"] == REPLICAS["Master"]["template"]
    assert JOB["spec"]["runPolicy"]["backoffLimit"] >= 1
    assert "elasticPolicy" not in JOB["spec"]  # a fixed world size keeps the global batch


def test_each_pod_runs_a_process_per_gpu() -> None:
    assert JOB["spec"]["nprocPerNode"] == str(RENDERED_GPUS or 1)  # a string in the v1 API
    assert CONTAINER["name"] == "pytorch"  # the container the operator configures
    limits = CONTAINER["resources"].get("limits", {})
    assert limits.get("nvidia.com/gpu") == (RENDERED_GPUS or None)
    assert {"name": "pytorchjob-port", "containerPort": OPERATOR_PORT} in CONTAINER["ports"]
    env = {item["name"]: item["value"] for item in CONTAINER["env"]}
    assert int(env["MAX_RESTARTS"]) >= 1  # torchrun re-forms the group when a pod comes back
    assert POD["terminationGracePeriodSeconds"] >= 60  # time for the preemption checkpoint


def test_every_pod_mounts_the_shared_volume_with_output_dir_and_data() -> None:
    claim = next(v for v in POD["volumes"] if v["name"] == "shared")["persistentVolumeClaim"]["claimName"]
    assert (CLAIM["kind"], CLAIM["metadata"]["name"]) == ("PersistentVolumeClaim", claim)
    assert "ReadWriteMany" in CLAIM["spec"]["accessModes"]  # every node reads the checkpoints
    shared = mount_of("shared")
    paths = {key: value for key, value in (arg.split("=", 1) for arg in CONTAINER["args"])}
    assert paths["output_dir"].startswith(f"{shared}/")
    data = [paths[key] for key in ("data.train_file", "data.val_file") if key in paths]
    assert all(path.startswith(f"{shared}/") for path in data)
    files_volume = FILES_POD["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert (FILES_POD["kind"], files_volume) == ("Pod", claim)


@pytest.mark.parametrize("node", range(RENDERED_NODES))
def test_launch_sh_in_a_pod_meets_the_others_on_the_master(tmp_path: Path, node: int) -> None:
    """The variables the operator sets in the pod of replica `node` (Master 0, Worker i -> node i + 1)."""
    nproc = RENDERED_GPUS or 1
    operator_env = {
        "MASTER_ADDR": f"{NAME}-master-0", "MASTER_PORT": str(OPERATOR_PORT), "RANK": str(node),
        "WORLD_SIZE": str(RENDERED_NODES * nproc), "PET_NNODES": str(RENDERED_NODES),
        "PET_NPROC_PER_NODE": JOB["spec"]["nprocPerNode"], "PET_NODE_RANK": str(node),
    }  # fmt: skip
    pod_env = {item["name"]: item["value"] for item in CONTAINER["env"]}
    if RENDERED_GPUS:  # what the device plugin exposes
        pod_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(RENDERED_GPUS)))
    # The config pre-check passes; the launcher prints torchrun's arguments.
    (tmp_path / "python").write_text(
        '#!/usr/bin/env bash\nif [[ "$2" == *.launcher ]]; then shift 2; printf "%s\\n" "$@"; fi\n'
    )
    (tmp_path / "python").chmod(0o755)
    ours = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RUN_ID")
    env = {k: v for k, v in os.environ.items() if k not in ours and not k.startswith(("PET_", "CUDA_"))}
    env.update(operator_env, **pod_env, PATH=f"{tmp_path}{os.pathsep}{env['PATH']}")
    result = subprocess.run(
        [str(PROJECT / "launch.sh"), *CONTAINER["args"]], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    torchrun = result.stdout.splitlines()
    assert f"--nproc-per-node={nproc}" in torchrun
    assert f"--max-restarts={pod_env['MAX_RESTARTS']}" in torchrun
    if RENDERED_NODES == 1:
        assert "--standalone" in torchrun
    else:
        for expected in [f"--nnodes={RENDERED_NODES}", "--rdzv-backend=c10d",
                         f"--rdzv-endpoint={NAME}-master-0:{OPERATOR_PORT}",
                         f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}"]:  # fmt: skip
            assert expected in torchrun
    assert torchrun[torchrun.index("-m") + 1 :] == [PACKAGE, *CONTAINER["args"]]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = (PROJECT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    words = [line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [(kind.upper(), arguments.strip()) for kind, arguments in words]


def test_dockerfile_installs_the_project_on_its_base_with_launch_sh_as_entry_point() -> None:
    steps = dockerfile_instructions()
    kinds = [kind for kind, _ in steps]
    image = steps[0][1] if kinds[0] == "FROM" else ""
    # CUDA PyTorch; a CPU project's image needs neither CUDA nor the CUDA build of torch.
    cuda_pytorch = r"pytorch/pytorch:\d+\.\d+\.\d+-cuda[\d.]+-cudnn\d+-(runtime|devel)"
    assert re.fullmatch(cuda_pytorch if RENDERED_GPUS else r"python:3\.\d+-slim", image), image
    assert kinds.count("FROM") == 1 and kinds.count("ENTRYPOINT") == 1
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["./launch.sh"]  # the PyTorchJob's args are overrides
    assert dict(steps)["WORKDIR"].startswith("/")
    runs = {arguments: position for position, (kind, arguments) in enumerate(steps) if kind == "RUN"}
    dependencies = next(at for arguments, at in runs.items() if "-r /tmp/requirements" in arguments)
    install = next(position for arguments, position in runs.items() if arguments.endswith("--no-deps ."))
    assert all("--mount=type=cache,target=/root/.cache/pip" in steps[at][1] for at in (dependencies, install))
    cpu_torch = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    assert (cpu_torch in steps[dependencies][1]) == (RENDERED_GPUS == 0)

    copied = {}  # source -> position
    for position, (kind, arguments) in enumerate(steps):
        if kind == "COPY":
            *sources, _ = [word for word in arguments.split() if not word.startswith("--")]
            copied.update(dict.fromkeys(sources, position))
    assert {"pyproject.toml", "src", "launch.sh"} <= copied.keys()
    # The dependencies' layer depends on pyproject.toml alone: a change to src/ downloads nothing again.
    assert copied["pyproject.toml"] < dependencies < copied["src"] < install
    lines = (PROJECT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    for source in copied:
        assert (PROJECT / source).exists(), f"COPY {source}: no such file"
        assert not {source, f"{source}/"} & ignored, f"{source} is in .dockerignore"
    assert {"outputs/", "demo/", ".venv/"} <= ignored  # no run outputs or environments in the image


def test_the_image_and_the_pods_run_as_an_unprivileged_user() -> None:
    steps = dockerfile_instructions()
    assert [arguments for kind, arguments in steps if kind == "USER"] == ["1000:1000"]  # numeric: checkable
    assert steps[-2] == ("USER", "1000:1000") and steps[-1][0] == "ENTRYPOINT"  # launch.sh runs as 1000
    for pod in (POD, FILES_POD["spec"]):
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (1000, 1000, 1000)


def test_pods_request_cpu_and_memory_and_bound_shared_memory() -> None:
    processes = RENDERED_GPUS or 1
    requests = CONTAINER["resources"]["requests"]
    assert requests == {"cpu": str(4 * processes), "memory": f"{16 * processes}Gi"}
    shm = next(volume for volume in POD["volumes"] if volume["name"] == "shm")["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": f"{2 * processes}Gi"}
    assert mount_of("shm") == "/dev/shm"
