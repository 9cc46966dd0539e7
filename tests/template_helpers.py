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
TEMPLATE_DIR_NAME = "{{cookiecutter.__project_dir}}"
# The files a template checkout consists of (what a `git clone` of the template must carry).
TEMPLATE_ENTRIES = ["cookiecutter.json", "hooks", TEMPLATE_DIR_NAME, ".gitignore"]
VENV_BIN = Path(sys.executable).parent
SHELLCHECK = str(VENV_BIN / "shellcheck")

# --- The answer matrix -------------------------------------------------------------------------------
GPUS_PER_NODE = ("0", "1", "8")
BACKENDS = ("nccl", "gloo")
PRECISIONS = ("bf16", "fp16", "fp32")
MODEL_TYPES = (
    "text-classification",
    "causal-lm",
    "image-classification",
    "custom",
    "token-classification",
    "seq2seq",
)
DEFAULT_PRETRAINED = {
    "text-classification": "distilbert/distilbert-base-uncased",
    "causal-lm": "openai-community/gpt2",
    "image-classification": "google/vit-base-patch16-224-in21k",
    "custom": "",
    "token-classification": "google-bert/bert-base-cased",
    "seq2seq": "google-t5/t5-small",
}
# A 60-character project name (argparse wraps a usage line after a long program name). The renders
# whose suites run under it do so in a shell without OMP_NUM_THREADS (torch then takes every core):
# users have both, and a generated suite must depend on neither.
LONG_NAME = "Multilingual Sentiment and Topic Classifiers Fine-Tuning Lab"
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
# strategy renders one YAML value and README text, the same for every GPU x backend x precision: fsdp2 is
# rendered once per model type that takes it, on a CPU and on a GPU combination (custom refuses it).
FSDP2_COMBINATIONS = [
    {**base, "model_type": model_type, "strategy": "fsdp2"}
    for model_type in MODEL_TYPES
    if model_type != "custom"
    for base in (
        {"gpus_per_node": "0", "backend": "gloo", "precision": "bf16"},
        {"gpus_per_node": "8", "backend": "nccl", "precision": "bf16"},
    )
]


# finetune=lora renders a YAML section, a dependency and README text, the same for every GPU x backend x
# precision: it is rendered once per model type that takes it, on a CPU and on a GPU combination (custom
# refuses it).
LORA_COMBINATIONS = [
    {**base, "model_type": model_type, "finetune": "lora"}
    for model_type in MODEL_TYPES
    if model_type != "custom"
    for base in (
        {"gpus_per_node": "0", "backend": "gloo", "precision": "fp32"},
        {"gpus_per_node": "8", "backend": "nccl", "precision": "bf16"},
    )
]


def combination_id(answers: dict[str, str]) -> str:
    return "-".join(f"{key}={value}" for key, value in answers.items())


# --- The expected files of a rendered project ----------------------------------------------------------
TEMPLATE = REPO / TEMPLATE_DIR_NAME
MODEL_TYPES_DIR = TEMPLATE / "model_types"
PACKAGE_DIR_NAME = "{{cookiecutter.package_name}}"
# What every model type's folder holds, at these paths in the project ("{pkg}": the package name).
MODEL_TYPE_FOLDER_FILES = [
    "src/{pkg}/model_type/__init__.py",
    "src/{pkg}/model_type/checks.py",
    "src/{pkg}/model_type/defaults.yaml",
    "src/{pkg}/model_type/demo.py",
    "src/{pkg}/model_type/predict.py",
    "src/{pkg}/model_type/task.py",
    "src/{pkg}/config/data.py",
    "docs/metrics.png",
]


def _template_paths(root: Path) -> list[str]:
    """The files under ``root``, as project paths with "{pkg}" for the package folder."""
    return [
        path.relative_to(root).as_posix().replace(PACKAGE_DIR_NAME, "{pkg}")
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]


def core_files() -> list[str]:
    """The shared core: the template's files outside the folder of model types."""
    return [path for path in _template_paths(TEMPLATE) if not path.startswith("model_types/")]


def model_type_files(model_type: str) -> list[str]:
    """The model type's files, where the post-gen hook moves them; its readme/ sections are rendered into
    README.md and go with the folder of model types."""
    return [path for path in _template_paths(MODEL_TYPES_DIR / model_type) if not path.startswith("readme/")]


# Mirrors CLUSTER_FILES in hooks/post_gen_project.py: the files each cluster answer adds when it is yes.
CLUSTER_FILES = {
    "slurm": ["slurm/train.sbatch", "tests/test_slurm.py"],
    "kubernetes": [
        "k8s/trainjob.yaml",
        "k8s/pytorchjob.yaml",
        "k8s/storage.yaml",
        "Dockerfile",
        ".dockerignore",
        "tests/kubernetes_files.py",
        "tests/test_kubernetes.py",
        "tests/test_trainjob.py",
        "tests/test_dockerfile.py",
    ],
}


# Mirrors TRACKER_FILES in hooks/post_gen_project.py: the files every tracker but none adds.
TRACKERS = ("none", "tensorboard", "wandb", "mlflow")
TRACKER_FILES = ["tests/test_tracker.py"]
# Mirrors HUGGING_FACE_FILES in hooks/post_gen_project.py: the files custom projects do without.
HUGGING_FACE_FILES = ["tests/test_lora.py"]


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
    """The core, the chosen model type's folder moved into place, the chosen options, the answers file."""
    unselected = [
        *([] if slurm else CLUSTER_FILES["slurm"]),
        *([] if kubernetes else CLUSTER_FILES["kubernetes"]),
        *(TRACKER_FILES if tracker == "none" else []),
        *(HUGGING_FACE_FILES if model_type == "custom" else []),
    ]
    paths = {*core_files(), *model_type_files(model_type), ".cookiecutter.json"} - set(unselected)
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
JINJA_SUFFIXES = {".jinja"}  # chat templates: Jinja by design, copied without rendering
GITHUB_EXPRESSION = re.compile(r"\$\{\{[^}]*\}\}")


def leftover_template_syntax(root: Path) -> list[str]:
    """'path: token' for every Jinja token left in a file's name or content."""
    found = []
    for relative in sorted(list_files(root)):
        if Path(relative).suffix in BINARY_SUFFIXES | JINJA_SUFFIXES:
            continue
        text = relative + "\n" + (root / relative).read_text(encoding="utf-8")
        text = GITHUB_EXPRESSION.sub("", text)  # ${{ ... }} is GitHub Actions' own syntax
        found += [f"{relative}: {token}" for token in ("{{", "{%", "{#") if token in text]
    return found


# --- Running tools -------------------------------------------------------------------------------------
def run(cmd: list[str], cwd: Path | str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def describe(proc: subprocess.CompletedProcess, chars: int = 6000) -> str:
    tail = (proc.stdout + proc.stderr)[-chars:]
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


# The skips a generated suite may report on this machine: tests of options this project does not have.
# Any other skip (a missing package, a fixture that gave up) fails the template test that ran the suite.
EXPECTED_SKIPS = (
    "GPU device selection: GPU projects only",  # tests/test_launch_script.py in a CPU project
    "wandb's login",  # tests/test_tracker.py with another tracker
)


def run_generated_suite(project: Path, args: list[str], env: dict[str, str], timeout: float = 900):
    """The project's own pytest with skip reasons listed (-rs), failing on any unexpected skip."""
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args]
    proc = run(command, cwd=project, env=env, timeout=timeout)
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    unexpected = [line for line in skipped if not line.rstrip().endswith(EXPECTED_SKIPS)]
    assert not unexpected, f"unexpected skips in {project.name}'s suite:\n" + "\n".join(unexpected)
    return proc


def lines_starting_with(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]
