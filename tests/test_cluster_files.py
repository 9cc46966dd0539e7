"""The cluster answers: slurm=yes adds an sbatch script, kubernetes=yes a PyTorchJob, its volume and a
Dockerfile, each with its own tests and README section; a project without them has none of it.

The cluster files depend on the GPU and node counts (and, for the data paths, the model type), not on the
rest of the matrix, so a few cases cover them instead of multiplying the answer matrix.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from conftest import require_rendered
from template_helpers import (
    REPO,
    VENV_BIN,
    bash_syntax_check,
    describe,
    expected_files,
    leftover_template_syntax,
    list_files,
    ruff_check,
    ruff_format_check,
    run,
    run_generated_suite,
    shellcheck,
)

# slurm, kubernetes, gpus_per_node, num_nodes, backend, precision, model_type
CLUSTER_CASES = [
    ("yes", "yes", "8", "4", "nccl", "bf16", "text-classification"),  # the "done when" project
    ("yes", "no", "0", "2", "gloo", "fp32", "custom"),  # a CPU cluster
    ("yes", "no", "1", "1", "gloo", "bf16", "causal-lm"),  # one node: torchrun --standalone
    ("no", "yes", "1", "1", "nccl", "fp16", "image-classification"),  # a Master and no Worker
    ("no", "yes", "0", "3", "gloo", "bf16", "causal-lm"),  # CPU pods: no GPU limits
    ("no", "no", "8", "4", "nccl", "bf16", "custom"),  # multi-node by hand: no cluster file
]
KEYS = ("slurm", "kubernetes", "gpus_per_node", "num_nodes", "backend", "precision", "model_type")
SLURM_CASES = [case for case in CLUSTER_CASES if case[0] == "yes"]
KUBERNETES_CASES = [case for case in CLUSTER_CASES if case[1] == "yes"]
WITH_CLUSTER_FILES = [case for case in CLUSTER_CASES if "yes" in case[:2]]
# The generated project's tests of each cluster answer's files.
GENERATED_CLUSTER_TESTS = {
    "slurm": ["test_slurm.py"],
    "kubernetes": ["test_kubernetes.py", "test_trainjob.py", "test_dockerfile.py"],
}


def case_id(case: tuple[str, ...]) -> str:
    return "slurm={}-k8s={}-gpus={}-nodes={}".format(*case[:4])


@pytest.fixture(scope="module")
def render(cookies_session):
    """`render(case)` -> (answers, {slurm, kubernetes: bool}, project), each case rendered once per module."""
    rendered = {}

    def _render(case):
        if case not in rendered:
            answers = dict(zip(KEYS, case, strict=True))
            project = require_rendered(cookies_session.bake(extra_context=answers, template=str(REPO)))
            rendered[case] = answers, {key: answers[key] == "yes" for key in ("slurm", "kubernetes")}, project
        return rendered[case]

    return _render


@pytest.fixture(params=CLUSTER_CASES, ids=case_id)
def rendered(request, render):
    return render(request.param)


def sbatch_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, flags=re.MULTILINE))


def test_renders_exactly_the_files_of_its_answers(rendered):
    answers, flags, project = rendered
    actual = list_files(project.path)
    expected = expected_files(answers["model_type"], project.package, **flags)
    assert sorted(actual - expected) == [], "unexpected files"
    assert sorted(expected - actual) == [], "missing files"
    assert (project.path / "slurm").is_dir() == flags["slurm"]  # no empty folder left behind
    assert (project.path / "k8s").is_dir() == flags["kubernetes"]


def test_records_the_cluster_answers_as_booleans(rendered):
    _, flags, project = rendered
    assert {key: project.answers[key] for key in flags} == flags
    recorded = json.loads((project.path / ".cookiecutter.json").read_text(encoding="utf-8"))["cookiecutter"]
    assert recorded["__kubernetes_name"] == "ddp-fine-tuning"


def test_is_clean(rendered):
    _, flags, project = rendered
    assert leftover_template_syntax(project.path) == []
    for proc in (ruff_check(project.path), ruff_format_check(project.path)):
        assert proc.returncode == 0, describe(proc)
    scripts = ["launch.sh"] + (["slurm/train.sbatch"] if flags["slurm"] else [])
    for script in scripts:
        for proc in (bash_syntax_check(project.path / script), shellcheck(project.path / script)):
            assert proc.returncode == 0 and proc.stdout == proc.stderr == "", describe(proc)
        assert os.access(project.path / script, os.X_OK), script


@pytest.mark.parametrize("case", SLURM_CASES, ids=case_id)
def test_sbatch_script_carries_the_answers(render, case):
    answers, _, project = render(case)
    text = (project.path / "slurm" / "train.sbatch").read_text(encoding="utf-8")
    options = sbatch_options(text)
    gpus = int(answers["gpus_per_node"])
    assert options["nodes"] == answers["num_nodes"]
    assert options["ntasks-per-node"] == "1"
    assert options.get("gpus-per-node") == (str(gpus) if gpus else None)
    assert options["cpus-per-task"] == str(4 * max(gpus, 1))
    assert options["signal"] == "B:USR1@300" and "requeue" in options and options["open-mode"] == "append"
    nproc = re.findall(r'^export NPROC_PER_NODE="\$\{NPROC_PER_NODE:-(\d+)\}"', text, flags=re.MULTILINE)
    assert nproc == ([str(gpus)] if gpus else [])
    assert "scontrol requeue" in text and "--kill-on-bad-exit=1" in text


@pytest.mark.parametrize("case", KUBERNETES_CASES, ids=case_id)
def test_pytorchjob_carries_the_answers(render, case):
    answers, _, project = render(case)
    job = yaml.safe_load((project.path / "k8s" / "pytorchjob.yaml").read_text(encoding="utf-8"))
    claim, files_pod = yaml.safe_load_all((project.path / "k8s" / "storage.yaml").read_text(encoding="utf-8"))
    gpus, nodes = int(answers["gpus_per_node"]), int(answers["num_nodes"])
    replicas = job["spec"]["pytorchReplicaSpecs"]

    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["metadata"]["name"] == "ddp-fine-tuning"
    assert job["spec"]["nprocPerNode"] == str(gpus or 1)
    assert replicas["Master"]["replicas"] == 1
    assert replicas.get("Worker", {}).get("replicas", 0) == nodes - 1
    assert ("Worker" in replicas) == (nodes > 1)
    container = replicas["Master"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == (gpus or None)
    assert all(spec["restartPolicy"] == "OnFailure" for spec in replicas.values())
    assert "output_dir=/shared/outputs/ddp-fine-tuning" in container["args"]
    assert (claim["kind"], claim["metadata"]["name"]) == ("PersistentVolumeClaim", "ddp-fine-tuning-shared")
    assert files_pod["kind"] == "Pod"


@pytest.mark.parametrize("case", KUBERNETES_CASES, ids=case_id)
def test_trainjob_carries_the_answers(render, case):
    answers, _, project = render(case)
    job = yaml.safe_load((project.path / "k8s" / "trainjob.yaml").read_text(encoding="utf-8"))
    gpus, nodes = int(answers["gpus_per_node"]), int(answers["num_nodes"])
    trainer = job["spec"]["trainer"]

    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["metadata"]["name"] == "ddp-fine-tuning"
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (nodes, gpus or 1)
    assert trainer["resourcesPerNode"].get("limits", {}).get("nvidia.com/gpu") == (gpus or None)
    assert trainer["command"] == ["/workspace/project/launch.sh"]
    assert "output_dir=/shared/outputs/ddp-fine-tuning" in trainer["args"]
    readme = (project.path / "README.md").read_text(encoding="utf-8")
    assert "kubectl apply -f k8s/trainjob.yaml" in readme and "kubectl api-resources" in readme
    assert "kubectl delete trainjob ddp-fine-tuning" in readme  # spec.trainer is immutable


@pytest.mark.parametrize("case", KUBERNETES_CASES, ids=case_id)
def test_dockerfile_builds_the_project_image(render, case):
    answers, _, project = render(case)
    lines = (project.path / "Dockerfile").read_text(encoding="utf-8").splitlines()
    base = (
        "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"
        if int(answers["gpus_per_node"])
        else "python:3.11-slim"
    )
    assert [line for line in lines if line.startswith("FROM ")] == [f"FROM {base}"]
    cpu_torch = "    pip install torch --index-url https://download.pytorch.org/whl/cpu && \\"
    assert (cpu_torch in lines) == (answers["gpus_per_node"] == "0")
    assert lines[0] == "# syntax=docker/dockerfile:1"  # BuildKit: the cache mounts and COPY --chmod
    assert lines[-2:] == ["USER 1000:1000", 'ENTRYPOINT ["./launch.sh"]']
    assert "outputs/" in (project.path / ".dockerignore").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("case", KUBERNETES_CASES, ids=case_id)
def test_dockerfile_passes_hadolint(render, case):
    _, _, project = render(case)
    proc = run([str(VENV_BIN / "hadolint"), "--no-color", "Dockerfile"], cwd=project.path)
    assert proc.returncode == 0 and proc.stdout == "", describe(proc)


def test_readme_documents_the_chosen_clusters_only(rendered):
    _, flags, project = rendered
    readme = (project.path / "README.md").read_text(encoding="utf-8")
    assert ("## SLURM" in readme) == flags["slurm"]
    assert ("sbatch slurm/train.sbatch train.lr=1e-4" in readme) == flags["slurm"]
    assert ("## Kubernetes" in readme) == flags["kubernetes"]
    kubernetes_commands = [
        'docker build -t "$IMAGE" . && docker push "$IMAGE"',
        "kubectl apply -f k8s/storage.yaml",
        "kubectl apply -f k8s/trainjob.yaml",
        "kubectl apply -f k8s/pytorchjob.yaml",
        "kubectl logs -f ddp-fine-tuning-master-0",
    ]
    for command in kubernetes_commands:
        assert (command in readme) == flags["kubernetes"], command
    assert "Multi-node by hand" in readme


@pytest.mark.parametrize("case", WITH_CLUSTER_FILES, ids=case_id)
def test_generated_cluster_tests_pass(render, case):
    """The project's own checks of its cluster files (fake srun, scontrol and torchrun; the manifests)."""
    _, flags, project = render(case)
    tests = ["tests/test_launch_script.py"] + [
        f"tests/{test}" for name, on in flags.items() if on for test in GENERATED_CLUSTER_TESTS[name]
    ]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # shellcheck, and this interpreter's tools
    env["PYTHONPATH"] = str(project.path / "src")
    proc = run_generated_suite(project.path, tests, env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert "failed" not in proc.stdout and " passed" in proc.stdout, describe(proc)


@pytest.mark.parametrize(
    ("slug", "name"),
    [
        ("My_Project", "my-project"),
        ("x" * 47 + "_tail", "x" * 47),  # cut to 48 characters, no trailing '-'
    ],
)
def test_kubernetes_name_is_derived_from_any_usable_slug(bake_ok, slug, name):
    project = bake_ok(project_slug=slug, package_name="pkg", kubernetes="yes")
    job = yaml.safe_load((project.path / "k8s" / "pytorchjob.yaml").read_text(encoding="utf-8"))
    assert job["metadata"]["name"] == name
    assert f"kubectl logs -f {name}-master-0" in (project.path / "README.md").read_text(encoding="utf-8")
