"""k8s/pytorchjob.yaml (the Training Operator v1) and k8s/storage.yaml: the job carries the answers
(pods, processes and GPUs per pod), every pod mounts the one volume that holds output_dir, and launch.sh
builds the right torchrun command line in the environment the training operator gives each pod."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubernetes_files import (
    CLAIM,
    FILES_POD,
    PROCESSES_PER_NODE,
    RENDERED_GPUS,
    RENDERED_NODES,
    assert_torchrun_meets_on,
    env_of,
    launch_in_pod,
    overrides_of,
)
from kubernetes_files import PYTORCHJOB as JOB

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
    assert JOB["spec"]["nprocPerNode"] == str(PROCESSES_PER_NODE)  # a string in the v1 API
    assert CONTAINER["name"] == "pytorch"  # the container the operator configures
    limits = CONTAINER["resources"].get("limits", {})
    assert limits.get("nvidia.com/gpu") == (RENDERED_GPUS or None)
    assert {"name": "pytorchjob-port", "containerPort": OPERATOR_PORT} in CONTAINER["ports"]
    assert int(env_of(CONTAINER)["MAX_RESTARTS"]) >= 1  # torchrun re-forms the group when a pod comes back
    assert POD["terminationGracePeriodSeconds"] >= 60  # time for the preemption checkpoint


def test_every_pod_mounts_the_shared_volume_with_output_dir_and_data() -> None:
    claim = next(v for v in POD["volumes"] if v["name"] == "shared")["persistentVolumeClaim"]["claimName"]
    assert (CLAIM["kind"], CLAIM["metadata"]["name"]) == ("PersistentVolumeClaim", claim)
    assert "ReadWriteMany" in CLAIM["spec"]["accessModes"]  # every node reads the checkpoints
    shared = mount_of("shared")
    paths = overrides_of(CONTAINER["args"])
    assert paths["output_dir"].startswith(f"{shared}/")
    data = [paths[key] for key in ("data.train_file", "data.val_file") if key in paths]
    assert all(path.startswith(f"{shared}/") for path in data)
    files_volume = FILES_POD["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert (FILES_POD["kind"], files_volume) == ("Pod", claim)


def test_pods_request_cpu_and_memory_and_bound_shared_memory() -> None:
    requests = CONTAINER["resources"]["requests"]
    assert requests == {"cpu": str(4 * PROCESSES_PER_NODE), "memory": f"{16 * PROCESSES_PER_NODE}Gi"}
    shm = next(volume for volume in POD["volumes"] if volume["name"] == "shm")["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": f"{2 * PROCESSES_PER_NODE}Gi"}
    assert mount_of("shm") == "/dev/shm"


@pytest.mark.parametrize("node", range(RENDERED_NODES))
def test_launch_sh_in_a_pod_meets_the_others_on_the_master(tmp_path: Path, node: int) -> None:
    """The variables the operator sets in the pod of replica `node` (Master 0, Worker i -> node i + 1)."""
    operator_env = {
        "MASTER_ADDR": f"{NAME}-master-0", "MASTER_PORT": str(OPERATOR_PORT), "RANK": str(node),
        "WORLD_SIZE": str(RENDERED_NODES * PROCESSES_PER_NODE), "PET_NNODES": str(RENDERED_NODES),
        "PET_NPROC_PER_NODE": JOB["spec"]["nprocPerNode"], "PET_NODE_RANK": str(node),
    }  # fmt: skip
    torchrun = launch_in_pod(tmp_path, {**operator_env, **env_of(CONTAINER)}, CONTAINER["args"])
    endpoint = f"{NAME}-master-0:{OPERATOR_PORT}"
    assert_torchrun_meets_on(torchrun, node, endpoint, env_of(CONTAINER), CONTAINER["args"])
