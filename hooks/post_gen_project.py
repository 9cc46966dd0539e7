"""Shape the rendered project: keep the files of the chosen options, record the answers, print next steps.

This hook runs only after pre_gen_project.py accepted the answers, and must never fail on them.
"""

import json
import os
import shutil
import stat
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")
PACKAGE = f"src/{ANSWERS['package_name']}"

# The one table of optional files: each model type owns whole files (task, demo builder, tests), and the
# files of the types not chosen are removed. The shared core is never listed here.
MODEL_TYPE_FILES = {
    "text-classification": [
        f"{PACKAGE}/tasks/text_classification.py",
        f"{PACKAGE}/demos/text_classification.py",
        "tests/test_text_classification.py",
    ],
    "causal-lm": [
        f"{PACKAGE}/tasks/causal_lm.py",
        f"{PACKAGE}/demos/causal_lm.py",
        "tests/test_causal_lm.py",
    ],
    "image-classification": [
        f"{PACKAGE}/tasks/image_classification.py",
        f"{PACKAGE}/demos/image_classification.py",
        "tests/test_image_classification.py",
    ],
    "custom": [
        f"{PACKAGE}/tasks/custom.py",
        f"{PACKAGE}/demos/custom.py",
        "tests/test_custom.py",
    ],
}
# Context entries of cookiecutter's own or of this render's output location, not answers. `_template`
# stays: it is where the project came from (a gh: URL or a path), which re-rendering needs.
UNRECORDED_KEYS = {"_output_dir", "_repo_dir", "_checkout", "_extensions", "__prompts__"}
EXECUTABLES = ["launch.sh"]


def prune(project: Path) -> None:
    unselected = (
        path
        for model_type, paths in MODEL_TYPE_FILES.items()
        if model_type != ANSWERS["model_type"]
        for path in paths
    )
    for relative in unselected:
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
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def print_next_steps(project: Path) -> None:
    package = ANSWERS["package_name"]
    print(
        f"\nCreated {project.name}/ ({ANSWERS['model_type']}). Next steps:\n"
        f"  cd {project.name}\n"
        "  python -m venv .venv && . .venv/bin/activate && pip install -e '.[test]'\n"
        f"  python -m {package}.demo                      # tiny local checkpoint + demo data, offline\n"
        "  NPROC_PER_NODE=2 ./launch.sh $(cat demo/overrides.txt)   # fine-tune it with 2 processes\n"
        "  pytest                                         # the project's own tests\n"
    )


if __name__ == "__main__":
    project_dir = Path(os.getcwd())
    prune(project_dir)
    record_answers(project_dir)
    make_executable(project_dir)
    print_next_steps(project_dir)
