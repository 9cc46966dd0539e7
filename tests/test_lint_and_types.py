"""Each model type's project is lint-clean and type-checks: ruff check, ruff format, mypy, shellcheck.

The rendered GPU answers (8 GPUs, nccl, bf16) exercise every branch of the rendering that reaches Python;
the other combinations differ from them by a rendered integer or a YAML value (test_answer_matrix.py).
strategy=fsdp2 and finetune=lora render YAML, a dependency and README text only; they are taken here
wherever they are valid.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import require_rendered
from template_helpers import (
    MODEL_TYPE_FOLDER_FILES,
    MODEL_TYPES,
    REPO,
    bash_syntax_check,
    describe,
    list_files,
    ruff_check,
    ruff_format_check,
    run,
    shellcheck,
)

LINT_ANSWERS = {"gpus_per_node": "8", "backend": "nccl", "precision": "bf16"}


@pytest.fixture(scope="module", params=MODEL_TYPES)
def project(request, cookies_session):
    hugging_face = request.param != "custom"  # custom refuses fsdp2 and lora
    answers = {
        **LINT_ANSWERS,
        "model_type": request.param,
        "strategy": "fsdp2" if hugging_face else "ddp",
        "finetune": "lora" if hugging_face else "full",
    }
    return require_rendered(cookies_session.bake(extra_context=answers, template=str(REPO)))


def test_passes_ruff_check(project):
    proc = ruff_check(project.path)
    assert proc.returncode == 0, describe(proc)


def test_passes_ruff_format_check(project):
    proc = ruff_format_check(project.path)
    assert proc.returncode == 0, describe(proc)


def test_passes_mypy(project, tmp_path_factory):
    """mypy with the settings in the project's pyproject.toml: among others, each model type's Task spec
    is checked against what the shared loop calls."""
    cache = tmp_path_factory.getbasetemp().parent / "mypy-cache"  # shared by the model types: torch once
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(cache)]
    proc = run(command, cwd=project.path, timeout=900)
    assert proc.returncode == 0, describe(proc)


def test_launch_sh_passes_bash_syntax_check_and_shellcheck(project):
    script = project.path / "launch.sh"
    for proc in (bash_syntax_check(script), shellcheck(script)):
        assert proc.returncode == 0, describe(proc)
        assert proc.stdout == proc.stderr == "", describe(proc)


def test_model_type_folder_provides_the_spec(project):
    """What a model type's folder must hold, so that one copied folder makes a new type."""
    files = list_files(project.path)
    expected = {path.format(pkg=project.package) for path in MODEL_TYPE_FOLDER_FILES}
    assert expected <= files
    test_file = f"tests/test_{project.answers['model_type'].replace('-', '_')}.py"
    assert test_file in files


def test_readme_config_reference_matches_the_schema(project):
    """The README's table holds the shared keys and this model type's own, and no other type's."""
    env = {**os.environ, "PYTHONPATH": str(project.path / "src")}
    command = [sys.executable, "-m", f"{project.package}.config_reference", "--check"]
    proc = subprocess.run(command, cwd=project.path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, describe(proc)
