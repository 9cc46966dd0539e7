"""Shared data and helpers of the template tests: the answer matrix, the expected files, tool runners.

Everything here is plain data or a pure function, so tests stay independent under pytest-xdist.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE_DIR_NAME = "{{cookiecutter.project_slug}}"
# The files a template checkout consists of (what a `git clone` of the template must carry).
TEMPLATE_ENTRIES = ["cookiecutter.json", "hooks", TEMPLATE_DIR_NAME, ".gitignore"]
VENV_BIN = Path(sys.executable).parent
SHELLCHECK = str(VENV_BIN / "shellcheck")

# --- The answer matrix -------------------------------------------------------------------------------
GPUS_PER_NODE = ("0", "1", "8")
BACKENDS = ("nccl", "gloo")
PRECISIONS = ("bf16", "fp16", "fp32")
MODEL_TYPES = ("text-classification", "causal-lm", "image-classification", "custom")
DEFAULT_PRETRAINED = {
    "text-classification": "distilbert/distilbert-base-uncased",
    "causal-lm": "openai-community/gpt2",
    "image-classification": "google/vit-base-patch16-224-in21k",
    "custom": "",
}
# Context entries that describe the machine or cookiecutter itself; they must not be recorded.
UNRECORDED_KEYS = {"_output_dir", "_repo_dir", "_checkout", "_commit", "_extensions", "__prompts__"}


def is_valid_combination(gpus: str, backend: str, precision: str) -> bool:
    """nccl and fp16 both need GPUs; everything else is a valid combination."""
    return not (gpus == "0" and (backend == "nccl" or precision == "fp16"))


ALL_COMBINATIONS = [
    {"gpus_per_node": g, "backend": b, "precision": p, "model_type": m}
    for g, b, p, m in itertools.product(GPUS_PER_NODE, BACKENDS, PRECISIONS, MODEL_TYPES)
]
VALID_COMBINATIONS = [
    c for c in ALL_COMBINATIONS if is_valid_combination(c["gpus_per_node"], c["backend"], c["precision"])
]


def combination_id(answers: dict[str, str]) -> str:
    return "-".join(f"{key}={value}" for key, value in answers.items())


# --- The expected files of a rendered project ----------------------------------------------------------
# "{pkg}" stands for the package name. The shared core is the same for every model type.
CORE_FILES = [
    ".cookiecutter.json",
    ".github/workflows/tests.yml",
    ".gitignore",
    ".pre-commit-config.yaml",
    "README.md",
    "docs/metrics.png",
    "launch.sh",
    "pyproject.toml",
    "src/{pkg}/__init__.py",
    "src/{pkg}/__main__.py",
    "src/{pkg}/checkpoint.py",
    "src/{pkg}/config.py",
    "src/{pkg}/config_reference.py",
    "src/{pkg}/constants.py",
    "src/{pkg}/data.py",
    "src/{pkg}/defaults.yaml",
    "src/{pkg}/demo.py",
    "src/{pkg}/demos/__init__.py",
    "src/{pkg}/distributed.py",
    "src/{pkg}/doctor.py",
    "src/{pkg}/errors.py",
    "src/{pkg}/evaluation.py",
    "src/{pkg}/launch_status.py",
    "src/{pkg}/launcher.py",
    "src/{pkg}/lifeline.py",
    "src/{pkg}/lock.py",
    "src/{pkg}/metrics.py",
    "src/{pkg}/model.py",
    "src/{pkg}/optim.py",
    "src/{pkg}/plot.py",
    "src/{pkg}/precision.py",
    "src/{pkg}/preemption.py",
    "src/{pkg}/preflight.py",
    "src/{pkg}/pretrained.py",
    "src/{pkg}/rng.py",
    "src/{pkg}/run.py",
    "src/{pkg}/throughput.py",
    "src/{pkg}/py.typed",
    "src/{pkg}/tasks/__init__.py",
    "src/{pkg}/trackers.py",
    "src/{pkg}/trainer.py",
    "tests/conftest.py",
    "tests/ddp_probe.py",
    "tests/test_config.py",
    "tests/test_doctor.py",
    "tests/test_equivalence.py",
    "tests/test_error_reports.py",
    "tests/test_faults.py",
    "tests/test_job_control.py",
    "tests/test_launch_script.py",
    "tests/test_plot.py",
    "tests/test_runtime.py",
    "tests/test_sampler.py",
    "tests/test_throughput.py",
    "tests/test_training.py",
]
# Mirrors MODEL_TYPE_FILES in hooks/post_gen_project.py: the files each model type owns.
MODEL_TYPE_FILES = {
    "text-classification": [
        "src/{pkg}/tasks/text_classification.py",
        "src/{pkg}/tasks/text_classification_checks.py",
        "src/{pkg}/demos/text_classification.py",
        "tests/test_text_classification.py",
    ],
    "causal-lm": [
        "src/{pkg}/tasks/causal_lm.py",
        "src/{pkg}/tasks/causal_lm_checks.py",
        "src/{pkg}/demos/causal_lm.py",
        "tests/test_causal_lm.py",
    ],
    "image-classification": [
        "src/{pkg}/tasks/image_classification.py",
        "src/{pkg}/tasks/image_classification_checks.py",
        "src/{pkg}/demos/image_classification.py",
        "tests/test_image_classification.py",
    ],
    "custom": [
        "src/{pkg}/tasks/custom.py",
        "src/{pkg}/tasks/custom_checks.py",
        "src/{pkg}/demos/custom.py",
        "tests/test_custom.py",
    ],
}


# Mirrors CLUSTER_FILES in hooks/post_gen_project.py: the files each cluster answer adds when it is yes.
CLUSTER_FILES = {
    "slurm": ["slurm/train.sbatch", "tests/test_slurm.py"],
    "kubernetes": [
        "k8s/pytorchjob.yaml",
        "k8s/storage.yaml",
        "Dockerfile",
        ".dockerignore",
        "tests/test_kubernetes.py",
    ],
}


# Mirrors TRACKER_FILES in hooks/post_gen_project.py: the files every tracker but none adds.
TRACKERS = ("none", "tensorboard", "wandb", "mlflow")
TRACKER_FILES = ["tests/test_tracker.py"]


def copy_template(destination: Path) -> None:
    """The template's files (what a git checkout of it holds) into ``destination``, caches left out."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ruff_cache", ".pytest_cache")
    for entry in TEMPLATE_ENTRIES:
        if (REPO / entry).is_dir():
            shutil.copytree(REPO / entry, destination / entry, ignore=ignore)
        else:
            shutil.copy2(REPO / entry, destination / entry)


def expected_files(
    model_type: str, package: str, slurm: bool = False, kubernetes: bool = False, tracker: str = "none"
) -> set[str]:
    paths = CORE_FILES + MODEL_TYPE_FILES[model_type]
    paths += CLUSTER_FILES["slurm"] if slurm else []
    paths += CLUSTER_FILES["kubernetes"] if kubernetes else []
    paths += TRACKER_FILES if tracker != "none" else []
    return {path.format(pkg=package) for path in paths}


def list_files(root: Path) -> set[str]:
    """Every file under root (hidden ones included), as POSIX paths relative to root."""
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if not path.is_dir()}


def read_tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Relative path -> (content, executable) of every file under root."""
    return {
        relative: ((root / relative).read_bytes(), os.access(root / relative, os.X_OK))
        for relative in sorted(list_files(root))
    }


BINARY_SUFFIXES = {".png"}
GITHUB_EXPRESSION = re.compile(r"\$\{\{[^}]*\}\}")


def leftover_template_syntax(root: Path) -> list[str]:
    """'path: token' for every Jinja token left in a file's name or content."""
    found = []
    for relative in sorted(list_files(root)):
        if Path(relative).suffix in BINARY_SUFFIXES:
            continue
        text = relative + "\n" + (root / relative).read_text(encoding="utf-8")
        text = GITHUB_EXPRESSION.sub("", text)  # ${{ ... }} is GitHub Actions' own syntax
        found += [f"{relative}: {token}" for token in ("{{", "{%", "{#") if token in text]
    return found


# --- Running tools -------------------------------------------------------------------------------------
def run(cmd: list[str], cwd: Path | str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def describe(proc: subprocess.CompletedProcess) -> str:
    tail = (proc.stdout + proc.stderr)[-6000:]
    return f"{proc.args!r} exited {proc.returncode}:\n{tail}"


def ruff_check(project: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=project)


def ruff_format_check(project: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."], cwd=project)


def bash_syntax_check(script: Path) -> subprocess.CompletedProcess:
    return run(["bash", "-n", script.name], cwd=script.parent)


def shellcheck(script: Path) -> subprocess.CompletedProcess:
    return run([SHELLCHECK, script.name], cwd=script.parent)


def write_user_config(directory: Path) -> Path:
    """A cookiecutter user config that keeps replay files and clones out of the home directory."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "cookiecutter-config.yaml"
    config.write_text(
        f"cookiecutters_dir: {json.dumps(str(directory / 'cookiecutters'))}\n"
        f"replay_dir: {json.dumps(str(directory / 'replay'))}\n",
        encoding="utf-8",
    )
    return config


def cookiecutter_cli(
    answers: dict[str, str], output_dir: Path, config_file: Path, template: Path = REPO
) -> subprocess.CompletedProcess:
    """`python -m cookiecutter --no-input <template> key=value ... -o <output_dir>`."""
    cmd = [sys.executable, "-m", "cookiecutter", "--no-input", "--config-file", str(config_file)]
    cmd += [str(template), *(f"{key}={value}" for key, value in answers.items()), "-o", str(output_dir)]
    return run(cmd, cwd=output_dir.parent)


def lines_starting_with(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]
