"""Shape the rendered project: keep the files of the chosen options, record the answers, print next steps.

This hook runs only after pre_gen_project.py accepted the answers, and must never fail on them.
"""

import json
import os
import shutil
import stat
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

# Each model type is one folder, model_types/<model_type>/, laid out like the project itself: the chosen
# one is moved into place (its src/, tests/ and docs/ files land at the same paths in the project), and
# the folder of model types goes. Its readme/ holds the README's sections of that type, which the README
# has already included while rendering.
MODEL_TYPES_DIR = "model_types"
README_SECTIONS = "readme"
# Each cluster answer owns whole files (folders included), removed when the answer is no.
CLUSTER_FILES = {
    "slurm": ["slurm", "tests/test_slurm.py"],
    "kubernetes": [
        "k8s",
        "Dockerfile",
        ".dockerignore",
        "tests/kubernetes_files.py",
        "tests/test_kubernetes.py",
        "tests/test_trainjob.py",
        "tests/test_dockerfile.py",
    ],
}
# Files that exist only with a tracker, removed when the tracker answer is none.
TRACKER_FILES = ["tests/test_tracker.py"]
# Files of the Hugging Face model types only (LoRA adapters), removed for model_type=custom.
HUGGING_FACE_FILES = ["tests/test_lora.py"]
# Context entries of cookiecutter's own or of this render's output location, not answers. `_template`
# stays: it is where the project came from (a gh: URL or a path), which re-rendering needs. cruft's
# `_commit` is kept in .cruft.json; here it would make every `cruft update` rewrite this file, and a
# project rendered by cookiecutter and then `cruft link`ed conflict on it.
UNRECORDED_KEYS = {"_output_dir", "_repo_dir", "_checkout", "_commit", "_extensions", "__prompts__"}
EXECUTABLES = ["launch.sh", "slurm/train.sbatch"]


def move_model_type_into_place(project: Path) -> None:
    chosen = project / MODEL_TYPES_DIR / ANSWERS["model_type"]
    for source in sorted(path for path in chosen.rglob("*") if path.is_file()):
        if source.relative_to(chosen).parts[0] == README_SECTIONS:
            continue
        target = project / source.relative_to(chosen)
        target.parent.mkdir(parents=True, exist_ok=True)
        source.replace(target)
    shutil.rmtree(project / MODEL_TYPES_DIR)


def unselected_files() -> list[str]:
    """The paths of the options not chosen (the pre-gen hook has made sure the flags are booleans)."""
    unselected = [paths for answer, paths in CLUSTER_FILES.items() if not ANSWERS[answer]]
    if ANSWERS["tracker"] == "none":
        unselected.append(TRACKER_FILES)
    if ANSWERS["model_type"] == "custom":
        unselected.append(HUGGING_FACE_FILES)
    return [path for paths in unselected for path in paths]


def prune(project: Path) -> None:
    for relative in unselected_files():
        path = project / relative
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def record_answers(project: Path) -> None:
    """Write the answers in cookiecutter's replay format, so the project can be rendered again."""
    answers = {key: value for key, value in ANSWERS.items() if key not in UNRECORDED_KEYS}
    text = json.dumps({"cookiecutter": answers}, indent=2, ensure_ascii=False) + "\n"
    (project / ".cookiecutter.json").write_text(text, encoding="utf-8")


def make_executable(project: Path) -> None:
    for relative in EXECUTABLES:
        path = project / relative
        if not path.exists():  # pruned with its option
            continue
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# torch's CPU build: a CPU project installs it first, so pip keeps it instead of the CUDA build.
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def next_steps(project: Path) -> list[tuple[str, str]]:
    """(command, comment) of each step: the README's quickstart, as it runs on the machine the answers
    describe (2 CPU processes, or one process per GPU)."""
    gpus = int(ANSWERS["gpus_per_node"])
    launch = f"NPROC_PER_NODE={gpus or 2} ./launch.sh $(cat demo/overrides.txt)"
    steps = [
        (f"cd {project.name}", ""),
        ("python -m venv .venv && . .venv/bin/activate", "a fresh environment"),
        *([(CPU_TORCH, "the CPU build of torch: no CUDA packages")] if gpus == 0 else []),
        ("pip install -e '.[test]'", "this project" + (", torch" if gpus else "") + " and the test tools"),
        (f"python -m {ANSWERS['package_name']}.demo", "tiny local checkpoint + demo data, offline"),
        (launch, "fine-tune it with 2 CPU processes" if gpus == 0 else "fine-tune it, one process per GPU"),
        ("pytest", "the project's own tests"),
    ]
    if ANSWERS["slurm"]:
        steps.append(("sbatch slurm/train.sbatch [key=value ...]", "on a SLURM cluster, see README"))
    if ANSWERS["kubernetes"]:
        steps.append(("kubectl apply -f k8s/trainjob.yaml", "on Kubeflow Trainer v2, see README"))
    return steps


def print_next_steps(project: Path) -> None:
    steps = next_steps(project)
    width = max(len(command) for command, comment in steps if comment)
    lines = [f"{command.ljust(width)}  # {comment}" if comment else command for command, comment in steps]
    print(f"\nCreated {project.name}/ ({ANSWERS['model_type']}). Next steps:")
    print("".join(f"  {line}\n" for line in lines))


if __name__ == "__main__":
    project_dir = Path(os.getcwd())
    move_model_type_into_place(project_dir)
    prune(project_dir)
    record_answers(project_dir)
    make_executable(project_dir)
    print_next_steps(project_dir)
