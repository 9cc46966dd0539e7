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
from conftest import Rendered, require_rendered
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


@pytest.fixture(scope="session")
def lint_render(cookies_session):
    """``lint_render(model_type)``: that type's project with LINT_ANSWERS, rendered once per session."""
    rendered: dict[str, Rendered] = {}

    def render(model_type: str) -> Rendered:
        if model_type not in rendered:
            hugging_face = model_type != "custom"  # custom refuses fsdp2 and lora
            answers = {
                **LINT_ANSWERS,
                "model_type": model_type,
                "strategy": "fsdp2" if hugging_face else "ddp",
                "finetune": "lora" if hugging_face else "full",
            }
            result = cookies_session.bake(extra_context=answers, template=str(REPO))
            rendered[model_type] = require_rendered(result)
        return rendered[model_type]

    return render


@pytest.fixture(scope="module", params=MODEL_TYPES)
def project(request, lint_render):
    return lint_render(request.param)


def test_passes_ruff_check(project):
    proc = ruff_check(project.path)
    assert proc.returncode == 0, describe(proc)


def test_passes_ruff_format_check(project):
    proc = ruff_format_check(project.path)
    assert proc.returncode == 0, describe(proc)


@pytest.mark.expected_s(60)
def test_every_model_type_passes_mypy(lint_render, tmp_path):
    """mypy with the settings in each project's pyproject.toml: among others, each model type's Task spec
    is checked against what the shared loop calls. One after the other, in one cache: torch and
    transformers are analysed once (about a minute), each further type takes seconds; side by side, two
    cold caches each took the minute."""
    failures = []
    for model_type in MODEL_TYPES:
        command = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache")]
        proc = run(command, cwd=lint_render(model_type).path, timeout=900)
        if proc.returncode != 0:
            failures.append(f"{model_type}:\n{describe(proc)}")
    assert not failures, "\n\n".join(failures)


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
