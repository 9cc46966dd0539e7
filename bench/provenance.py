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

from former_layout import MOVED_MODULES, OLD_LAYOUT_MARK, changed_files

REPO = Path(__file__).resolve().parents[1]

_PROJECT = "{{cookiecutter.__project_dir}}"
_PACKAGE = f"{_PROJECT}/src/{{{{cookiecutter.package_name}}}}"
# The shared modules a table measures, as dotted names under the package.
SHARED_MODULES = (
    "loop.trainer",
    "loop.step_targets",
    "loop.longest_batch",
    "data.loader",
    "data.cache",
    "data.sources",
    "data.arrow_rows",
    "data.labels",
    "data.sampling",
    "data.batch_plan",
    "loop.setup",
    "parallel.ddp",
    "parallel.precision",
    "loop.optim",
    "task.lora",
)
_FORMER_NAMES = {new: old for old, new in MOVED_MODULES.items()}  # today's dotted name -> the former
SHARED_CODE = [f"{_PROJECT}/launch.sh", *(f"{_PACKAGE}/{n.replace('.', '/')}.py" for n in SHARED_MODULES)]
# A module written since the move has no former name: tables of the former layout ran without it.
_FORMER_SHARED_CODE = [
    SHARED_CODE[0],
    *(f"{_PACKAGE}/{_FORMER_NAMES[n]}.py" for n in SHARED_MODULES if n in _FORMER_NAMES),
]
MODEL_TYPE_CODE = (
    "model_type/task.py",
    "model_type/recipe.py",
    "model_type/packing.py",
    "model_type/padding_free.py",
    "model_type/instructions.py",
    "model_type/image_folders.py",
    "config/data.py",
    "model_type/defaults.yaml",
    "model_type/demo.py",
)
_FORMER_MODEL_TYPE_CODE = tuple(
    name.replace("config/data.py", "model_type/settings.py") for name in MODEL_TYPE_CODE
)


def model_type_code(model_type: str, names: tuple[str, ...] = MODEL_TYPE_CODE) -> list[str]:
    return [f"{_PROJECT}/model_types/{model_type}/src/*/{name}" for name in names]


PROJECT_CODE = [*SHARED_CODE, *model_type_code("*")]
# Each kind of table, by its file name's start: the bench code that wrote it and the project code it ran.
# The main bench, the data-scale bench and the GPU check do not run each other's scripts, so a change to
# one leaves the others' tables standing.
_SEPARATE = ("bench/data_scale*.py", "bench/gpu_check*")
# provenance.py and former_layout.py stamp and compare commits; they run no workload.
_BOOKKEEPING = ("bench/provenance.py", "bench/former_layout.py")


def _measured(shared: list[str], model_type_names: tuple[str, ...]) -> dict[str, list[str]]:
    project = [*shared, *model_type_code("*", model_type_names)]
    return {
        # The data-scale bench renders the text-classification project only.
        "data-scale-": [
            "bench/data_scale*.py",
            "bench/measure.py",
            *shared,
            *model_type_code("text-classification", model_type_names),
        ],
        "gpu-check-": ["bench/gpu_check*", *project],
        "": [
            "bench/*.py",
            "bench/runners/*.py",
            "bench/run.sh",
            *project,
            *(f"!{pattern}" for pattern in (*_SEPARATE, *_BOOKKEEPING)),
        ],
    }


MEASURED_CODE = _measured(SHARED_CODE, MODEL_TYPE_CODE)
# The same code as the layout before the package was grouped by concern named it (former_layout.py).
_FORMER_MEASURED_CODE = _measured(_FORMER_SHARED_CODE, _FORMER_MODEL_TYPE_CODE)
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

COMMIT_LINE = re.compile(r"Template commit ([0-9a-f]{7,40})(\+dirty)?\.")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO)


def measured_code(table: str, tables: dict[str, list[str]] = MEASURED_CODE) -> list[str]:
    """The measured code of the table named ``table`` (a file name), as glob patterns; "!" excludes."""
    return next(patterns for start, patterns in tables.items() if table.startswith(start))


def _pathspecs(table: str, tables: dict[str, list[str]] = MEASURED_CODE) -> list[str]:
    return [
        f":(glob,exclude){pattern[1:]}" if pattern.startswith("!") else f":(glob){pattern}"
        for pattern in measured_code(table, tables)
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
    if _git("cat-file", "-e", f"{commit}:{OLD_LAYOUT_MARK}").returncode == 0:
        return _changed_across_the_move(commit, table)
    diff = _git("diff", "--name-only", commit, "--", *_pathspecs(table))
    if diff.returncode != 0:
        raise ValueError(f"commit {commit} is not in this checkout's history: {diff.stderr.strip()}")
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *_pathspecs(table)).stdout
    return sorted(set(diff.stdout.split()) | set(untracked.split()))


def _changed_across_the_move(commit: str, table: str) -> list[str]:
    """The measured files that differ from ``commit``, a commit of the former layout, read in today's."""
    then = _git("diff", "--name-only", _EMPTY_TREE, commit, "--", *_pathspecs(table, _FORMER_MEASURED_CODE))
    old = {path: _git("show", f"{commit}:{path}").stdout for path in then.stdout.split()}
    now = _git("ls-files", "--cached", "--others", "--exclude-standard", "--", *_pathspecs(table)).stdout
    new = {path: (REPO / path).read_text(encoding="utf-8") for path in now.split() if (REPO / path).is_file()}
    return changed_files(old, new)


def named_commit(table: str) -> tuple[str, bool] | None:
    """(commit, dirty) a results table names, or None when it names none."""
    found = COMMIT_LINE.search(table)
    return None if found is None else (found[1], bool(found[2]))
