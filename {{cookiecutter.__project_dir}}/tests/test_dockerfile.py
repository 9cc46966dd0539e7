"""The Dockerfile installs this project on a CUDA PyTorch image (slim Python with the CPU build of torch for
a CPU project) in layers that a code change does not re-download, as an unprivileged user, with launch.sh
as the entry point, the image both Kubernetes jobs run."""

from __future__ import annotations

import json
import re

from conftest import PROJECT
from kubernetes_files import FILES_POD, PYTORCHJOB, RENDERED_GPUS, TRAINJOB


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
    trainjob_patch = TRAINJOB["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    trainjob_pod = trainjob_patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pytorchjob_pod = PYTORCHJOB["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    for pod in (trainjob_pod, pytorchjob_pod, FILES_POD["spec"]):
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True
        assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (1000, 1000, 1000)
