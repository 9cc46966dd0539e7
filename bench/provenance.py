"""Which template commit a results table measured, and whether that code is still the code of HEAD.

A table is only evidence for the code it ran: the bench's own code, the generated project's training
loop, data and sampling code, the launch script, and the demos the bench builds its checkpoints with.
It names the commit it ran on ("+dirty" when any of that code had uncommitted changes), and
tests/test_bench.py fails once any of it changes after that commit.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_PROJECT = "{{cookiecutter.__project_dir}}"
_PACKAGE = f"{_PROJECT}/src/{{{{cookiecutter.package_name}}}}"
SHARED_CODE = [
    f"{_PROJECT}/launch.sh",
    *(
        f"{_PACKAGE}/{name}.py"
        for name in (
            "trainer",
            "longest_batch",
            "data",
            "data_cache",
            "data_sources",
            "arrow_rows",
            "labels",
            "sampling",
            "batch_plan",
            "setup",
            "model",
            "precision",
            "optim",
            "lora",
        )
    ),
]
MODEL_TYPE_CODE = (
    "task.py",
    "packing.py",
    "padding_free.py",
    "instructions.py",
    "image_folders.py",
    "settings.py",
    "defaults.yaml",
    "demo.py",
)


def model_type_code(model_type: str) -> list[str]:
    return [f"{_PROJECT}/model_types/{model_type}/src/*/model_type/{name}" for name in MODEL_TYPE_CODE]


PROJECT_CODE = [*SHARED_CODE, *model_type_code("*")]
# Each kind of table, by its file name's start: the bench code that wrote it and the project code it ran.
# The main bench, the data-scale bench and the GPU check do not run each other's scripts, so a change to
# one leaves the others' tables standing.
_SEPARATE = ("bench/data_scale*.py", "bench/gpu_check*")
MEASURED_CODE = {
    # The data-scale bench renders the text-classification project only.
    "data-scale-": [
        "bench/data_scale*.py",
        "bench/measure.py",
        *SHARED_CODE,
        *model_type_code("text-classification"),
    ],
    "gpu-check-": ["bench/gpu_check*", *PROJECT_CODE],
    "": [
        "bench/*.py",
        "bench/runners/*.py",
        "bench/run.sh",
        *PROJECT_CODE,
        *(f"!{pattern}" for pattern in _SEPARATE),
    ],
}
COMMIT_LINE = re.compile(r"Template commit ([0-9a-f]{7,40})(\+dirty)?\.")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO)


def measured_code(table: str) -> list[str]:
    """The measured code of the table named ``table`` (a file name), as glob patterns; "!" excludes."""
    return next(patterns for start, patterns in MEASURED_CODE.items() if table.startswith(start))


def _pathspecs(table: str) -> list[str]:
    return [
        f":(glob,exclude){pattern[1:]}" if pattern.startswith("!") else f":(glob){pattern}"
        for pattern in measured_code(table)
    ]


def current_commit(table: str = "") -> str:
    """HEAD's short hash, with "+dirty" when the measured code of ``table`` (a file name; the main
    bench's by default) has uncommitted changes; "unknown" outside a git checkout."""
    head = _git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = _git("status", "--porcelain", "--", *_pathspecs(table)).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def changed_since(commit: str, table: str = "") -> list[str]:
    """The measured files of ``table`` that differ between ``commit`` and the working tree (tracked or
    not)."""
    diff = _git("diff", "--name-only", commit, "--", *_pathspecs(table))
    if diff.returncode != 0:
        raise ValueError(f"commit {commit} is not in this checkout's history: {diff.stderr.strip()}")
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *_pathspecs(table)).stdout
    return sorted(set(diff.stdout.split()) | set(untracked.split()))


def named_commit(table: str) -> tuple[str, bool] | None:
    """(commit, dirty) a results table names, or None when it names none."""
    found = COMMIT_LINE.search(table)
    return None if found is None else (found[1], bool(found[2]))
