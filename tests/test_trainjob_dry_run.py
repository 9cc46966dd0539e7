"""A dry run of Kubeflow Trainer v2's part: from the rendered k8s/trainjob.yaml and the verbatim
`torch-distributed` ClusterTrainingRuntime, derive each node's pod (hostname, environment, command,
mounts) the way the runtime defines it, and run those pods through to `final/` on emulated hosts (the
generated project's tests/emulated_hosts.py).

What the Trainer does is read off its v2.3.0 sources: the runtime's replicated job whose pod template has
the label `trainer.kubeflow.org/trainjob-ancestor-step: trainer` runs the TrainJob's `trainer`, in its
container `node`, as an Indexed Job of `numNodes` pods; the Torch plugin (the runtime's `mlPolicy.torch`)
adds `PET_NNODES`, `PET_NPROC_PER_NODE`, `PET_NODE_RANK` (the pod's completion index) and
`PET_MASTER_ADDR`/`PET_MASTER_PORT` (`<job>-node-0-0.<job>:29500`, node 0's pod in the job's headless
service); `runtimePatches` add the volumes, mounts and security context. JobSet names the pods
`<job>-node-0-<index>` and gives them DNS names under the subdomain `<job>`.

The image is the project's Dockerfile: here the rendered project runs from its source tree in this
interpreter, with the image's WORKDIR and the pod's volume mounts mapped to folders of the test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import require_rendered
from kubernetes_schemas import SHARED_SCHEMAS, TORCH_RUNTIME, shared_file
from template_helpers import REPO, VENV_BIN

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SHARED_SCHEMAS.is_dir(), reason=f"no Kubeflow schemas in {SHARED_SCHEMAS}"),
]

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_CONTAINER = "node"
TRAINER_PORT = 29500
WORKDIR = "/workspace/project"  # the image's, as the Dockerfile sets it
ANSWERS = {"kubernetes": "yes", "gpus_per_node": "0", "num_nodes": "2", "backend": "gloo",
           "precision": "fp32", "model_type": "text-classification"}  # fmt: skip


@dataclass
class Pod:
    hostname: str
    dns_name: str
    env: dict[str, str]
    argv: list[str]
    mounts: dict[str, str]  # mountPath -> volume


def trainer_pods(trainjob: dict, runtime: dict) -> list[Pod]:
    """The trainer pods that the TrainJob on this runtime becomes."""
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    policy = runtime["spec"]["mlPolicy"]
    assert "torch" in policy, "the PET_ variables come from the runtime's Torch plugin"
    (job,) = [
        job
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        if job["template"]["metadata"]["labels"].get(ANCESTOR_LABEL) == "trainer"
    ]
    pod_spec = job["template"]["spec"]["template"]["spec"]
    (container,) = [c for c in pod_spec["containers"] if c["name"] == TRAINER_CONTAINER]
    nodes = trainer.get("numNodes", policy.get("numNodes", 1))
    processes = trainer.get("numProcPerNode", policy["torch"].get("numProcPerNode", "auto"))
    env = {item["name"]: item["value"] for item in [*container.get("env", []), *trainer.get("env", [])]}
    env |= {
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(processes),
        "PET_MASTER_ADDR": f"{name}-{job['name']}-0-0.{name}",
        "PET_MASTER_PORT": str(TRAINER_PORT),
    }
    command = trainer.get("command", container.get("command", []))
    argv = [*command, *trainer.get("args", container.get("args", []))]
    mounts = patched_mounts(trainjob, job["name"])
    pods = []
    for index in range(nodes):
        hostname = f"{name}-{job['name']}-0-{index}"
        pods.append(Pod(hostname, f"{hostname}.{name}", {**env, "PET_NODE_RANK": str(index)}, argv, mounts))
    return pods


def patched_mounts(trainjob: dict, job_name: str) -> dict[str, dict]:
    """mountPath -> volume of the trainer container, from the TrainJob's runtimePatches."""
    mounts = {}
    for patch in trainjob["spec"].get("runtimePatches", []):
        for job_patch in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            if job_patch["name"] != job_name:
                continue
            pod = job_patch["template"]["spec"]["template"]["spec"]
            volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
            for container in pod.get("containers", []):
                if container["name"] == TRAINER_CONTAINER:
                    mounts |= {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}
    return mounts


def to_host(value: str, paths: dict[str, Path]) -> str:
    """A path of the container (or a key=path override) as the test's folder that stands in for it."""
    key, equals, path = value.rpartition("=")
    for container_path, host_path in paths.items():
        if path == container_path or path.startswith(f"{container_path}/"):
            return f"{key}{equals}{host_path}{path[len(container_path) :]}"
    return value


def container_paths(project: Path, pod: Pod, claim: dict, volumes: Path) -> dict[str, Path]:
    """The image's WORKDIR is the rendered project; the claim of storage.yaml a folder of the test; the
    shared memory is this machine's."""
    dockerfile = (project / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^WORKDIR (\S+)", dockerfile, flags=re.MULTILINE).group(1) == WORKDIR
    paths = {WORKDIR: project}
    for mount_path, source in pod.mounts.items():
        if "persistentVolumeClaim" in source:
            assert source["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
            paths[mount_path] = volumes / claim["metadata"]["name"]
        else:
            assert (mount_path, source["emptyDir"]["medium"]) == ("/dev/shm", "Memory")
    return paths


def demo_in_the_volume(project: Path, volume: Path, demo: Path) -> list[str]:
    """What the README has the user do: the data into the volume, then their overrides in `args:`; here
    the demo's checkpoint and data (there is no hub to download a pretrained model from)."""
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    module = f"{project.name.replace('-', '_')}.demo"
    subprocess.run([str(VENV_BIN / "python"), "-m", module, str(demo)], cwd=project, env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    shutil.copytree(demo / "model", volume / "models" / "demo")
    (volume / "data").mkdir()
    for split in ("train", "val"):
        shutil.copy(demo / f"{split}.jsonl", volume / "data" / f"{split}.jsonl")
    overrides = (demo / "overrides.txt").read_text(encoding="utf-8").split()
    schedule = [item for item in overrides if item.startswith(("train.", "data.batch_size="))]
    return [*schedule, "model.pretrained=/shared/models/demo", "data.num_workers=0"]


def start_pods(pods: list[Pod], hosts: list, paths: dict[str, Path], args: list[str], logs: Path):
    """Each pod's container on its host: the image's environment (one thread per process on this
    shared machine), the pod's variables and command, the user's overrides appended to `args:`."""
    processes = []
    for pod, host in zip(pods, hosts, strict=True):
        env = {key: to_host(value, paths) for key, value in pod.env.items()}
        env |= {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(logs / "home"),
            "PYTHONPATH": str(paths[WORKDIR] / "src"),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
        argv = host.command([to_host(arg, paths) for arg in [*pod.argv, *args]])
        with (logs / f"{pod.hostname}.log").open("a") as log:
            processes.append(
                subprocess.Popen(argv, cwd=paths[WORKDIR], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    return processes


def exit_codes(pods: list[Pod], processes: list[subprocess.Popen], logs: Path) -> dict[str, int]:
    codes = {pod.hostname: process.wait(timeout=600) for pod, process in zip(pods, processes, strict=True)}
    for pod in pods:
        log = (logs / f"{pod.hostname}.log").read_text(encoding="utf-8")
        print(f"--- {pod.hostname} exited {codes[pod.hostname]}:\n{log[-2000:]}")
    return codes


@pytest.mark.expected_s(25)
def test_the_trainjob_trains_to_final_through_an_eviction_on_emulated_hosts(cookies_session, tmp_path):
    """Node 1's pod is evicted (SIGTERM to its container) after the first checkpoint: every pod exits 75,
    the pods restart in place as JobSet's OnFailure has them, and the job resumes to `final/`."""
    project = require_rendered(cookies_session.bake(extra_context=ANSWERS, template=str(REPO))).path
    sys.path.insert(0, str(project / "tests"))  # the generated project's harness of emulated hosts
    from emulated_hosts import emulated_hosts, unavailable

    if reason := unavailable():
        pytest.skip(reason)
    trainjob = yaml.safe_load((project / "k8s" / "trainjob.yaml").read_text(encoding="utf-8"))
    runtime = yaml.safe_load(shared_file(TORCH_RUNTIME).read_text(encoding="utf-8"))
    claim = next(yaml.safe_load_all((project / "k8s" / "storage.yaml").read_text(encoding="utf-8")))
    pods = trainer_pods(trainjob, runtime)
    assert len(pods) == int(ANSWERS["num_nodes"])
    paths = container_paths(project, pods[0], claim, tmp_path / "volumes")
    # Long enough that the eviction lands mid-run, whatever this machine's speed.
    user_args = [
        *demo_in_the_volume(project, Path(to_host("/shared", paths)), tmp_path / "demo"),
        "train.epochs=12",
    ]
    output_dir = Path(to_host(dict(arg.split("=", 1) for arg in pods[0].argv[1:])["output_dir"], paths))

    with emulated_hosts([pod.hostname for pod in pods], aliases=[[pod.dns_name] for pod in pods]) as hosts:
        processes = start_pods(pods, hosts, paths, user_args, tmp_path)
        deadline = time.monotonic() + 300
        while not list((output_dir / "checkpoints").glob("step-*.pt")):
            assert all(process.poll() is None for process in processes), exit_codes(pods, processes, tmp_path)
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        processes[1].send_signal(signal.SIGTERM)  # the kubelet's eviction signal, to the container's PID 1
        assert set(exit_codes(pods, processes, tmp_path).values()) == {75}
        assert not (output_dir / "final").exists()

        processes = start_pods(pods, hosts, paths, user_args, tmp_path)  # the restart in place
        assert set(exit_codes(pods, processes, tmp_path).values()) == {0}

    assert (output_dir / "final" / "config.json").is_file()
    rank_0_log = (tmp_path / f"{pods[0].hostname}.log").read_text(encoding="utf-8")
    assert "resumed from" in rank_0_log
    assert f"parameters identical on all {len(pods)} rank(s)" in rank_0_log
