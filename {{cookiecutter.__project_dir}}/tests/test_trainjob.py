"""k8s/trainjob.yaml, the Kubeflow Trainer v2 job: it runs on the built-in torch-distributed runtime with a
node per answer and a process per GPU, asks for the resources the v1 PyTorchJob asks for, mounts the
shared volume that holds output_dir, runs launch.sh from the image with the same overrides, and launch.sh
builds the right torchrun command line from the variables the runtime gives each node's pod."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import PROJECT
from kubernetes_files import (
    CLAIM,
    PROCESSES_PER_NODE,
    PYTORCHJOB,
    RENDERED_GPUS,
    RENDERED_NODES,
    TRAINJOB,
    assert_torchrun_meets_on,
    env_of,
    launch_in_pod,
    overrides_of,
)

NAME = TRAINJOB["metadata"]["name"]
TRAINER = TRAINJOB["spec"]["trainer"]
PATCHES = TRAINJOB["spec"]["runtimePatches"]
NODE_JOB = PATCHES[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
POD = NODE_JOB["template"]["spec"]["template"]["spec"]
CONTAINER = POD["containers"][0]
V1_CONTAINER = PYTORCHJOB["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
# What the torch-distributed runtime's Torch plugin gives every node: node 0's pod
# (<job>-node-0-0 in the job's headless service <job>) hosts the rendezvous on port 29500.
RUNTIME_MASTER = (f"{NAME}-node-0-0.{NAME}", 29500)
RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}


def test_a_node_per_answer_on_the_torch_distributed_runtime() -> None:
    assert (TRAINJOB["apiVersion"], TRAINJOB["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert TRAINJOB["metadata"] == PYTORCHJOB["metadata"]  # one name for both
    assert TRAINJOB["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    assert TRAINER["numNodes"] == RENDERED_NODES
    assert TRAINER["numProcPerNode"] == PROCESSES_PER_NODE  # a number: "auto" would count CPU cores
    # The runtime refuses a TrainJob that sets the variables it sets itself.
    assert not RESERVED & env_of(TRAINER).keys()


def test_each_node_asks_for_what_the_pytorchjob_asks_for() -> None:
    resources = TRAINER["resourcesPerNode"]
    assert resources["requests"] == V1_CONTAINER["resources"]["requests"]
    assert resources["requests"] == {
        "cpu": str(4 * PROCESSES_PER_NODE),
        "memory": f"{16 * PROCESSES_PER_NODE}Gi",
    }
    assert resources.get("limits", {}).get("nvidia.com/gpu") == (RENDERED_GPUS or None)
    assert env_of(TRAINER) == env_of(V1_CONTAINER)  # MAX_RESTARTS, HF_HOME
    assert POD["terminationGracePeriodSeconds"] >= 60  # time for the preemption checkpoint


def test_it_runs_launch_sh_of_the_image_with_the_pytorchjobs_overrides() -> None:
    dockerfile = (PROJECT / "Dockerfile").read_text(encoding="utf-8")
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, flags=re.MULTILINE).group(1)
    assert TRAINER["command"] == [f"{workdir}/launch.sh"]
    assert TRAINER["image"] == V1_CONTAINER["image"]
    assert TRAINER["args"] == V1_CONTAINER["args"]


def test_every_node_mounts_the_shared_volume_with_output_dir_and_data() -> None:
    assert [patch["manager"] for patch in PATCHES] == [f"{NAME}.k8s-trainjob-yaml"]
    assert NODE_JOB["name"] == "node"  # the runtime's replicated job of training nodes
    assert CONTAINER["name"] == "node"  # and its training container
    volumes = {volume["name"]: volume for volume in POD["volumes"]}
    mounts = {mount["name"]: mount["mountPath"] for mount in CONTAINER["volumeMounts"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == CLAIM["metadata"]["name"]
    paths = overrides_of(TRAINER["args"])
    assert paths["output_dir"].startswith(f"{mounts['shared']}/")
    data = [paths[key] for key in ("data.train_file", "data.val_file") if key in paths]
    assert all(path.startswith(f"{mounts['shared']}/") for path in data)
    assert env_of(TRAINER)["HF_HOME"].startswith(f"{mounts['shared']}/")
    assert mounts["shm"] == "/dev/shm"
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{2 * PROCESSES_PER_NODE}Gi"}


@pytest.mark.parametrize("node", range(RENDERED_NODES))
def test_launch_sh_on_a_node_meets_the_others_on_node_0(tmp_path: Path, node: int) -> None:
    """The variables the runtime sets in the pod of node `node` (its Job's completion index)."""
    runtime_env = {
        "PET_NNODES": str(TRAINER["numNodes"]), "PET_NPROC_PER_NODE": str(TRAINER["numProcPerNode"]),
        "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": RUNTIME_MASTER[0],
        "PET_MASTER_PORT": str(RUNTIME_MASTER[1]),
    }  # fmt: skip
    torchrun = launch_in_pod(tmp_path, {**env_of(TRAINER), **runtime_env}, TRAINER["args"])
    endpoint = "{}:{}".format(*RUNTIME_MASTER)
    assert_torchrun_meets_on(torchrun, node, endpoint, env_of(TRAINER), TRAINER["args"])
