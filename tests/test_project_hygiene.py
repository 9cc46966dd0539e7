"""Hygiene of a rendered project: pre-commit runs ruff, a GitHub Actions workflow runs its CPU tests,
outputs are git-ignored, the package is typed."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from template_helpers import REPO, VENV_BIN, describe, run

PINNED_RUFF = re.search(r"^ruff==(\S+)$", (REPO / "requirements-test.txt").read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def project(cookies_session):
    result = cookies_session.bake(extra_context={"tracker": "mlflow"}, template=str(REPO))
    assert result.exception is None, result.exception
    return result.project_path


def test_ruff_is_pinned_once_in_the_test_extra_that_ci_and_pre_commit_use(project):
    extra = tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "test"
    ]
    assert [spec for spec in extra if spec.startswith("ruff")] == [f"ruff=={PINNED_RUFF}"]  # the template's
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert set(hooks) == {"ruff-check", "ruff-format"}
    for hook in hooks.values():  # the environment's ruff, which the test extra installed; no second pin
        assert hook["language"] == "system" and hook["entry"].startswith("ruff ")
        assert "additional_dependencies" not in hook
    workflow = (project / ".github" / "workflows" / "tests.yml").read_text()
    assert "ruff" not in workflow.replace("which pins ruff", "")  # CI gets it from the extra only


def test_workflow_lints_and_runs_the_tests_on_cpu(project):
    text = (project / ".github" / "workflows" / "tests.yml").read_text()
    assert "${{ github.workflow }}-${{ github.ref }}" in text  # GitHub's expressions survive rendering
    workflow = yaml.safe_load(text)
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert {"push", "pull_request"} <= set(triggers)
    steps = [step.get("run", "") for step in workflow["jobs"]["cpu"]["steps"]]
    commands = [line.strip() for step in steps for line in step.splitlines()]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in commands
    assert "pip install -e '.[test]'" in commands
    assert {"make lint", "make typecheck", "make test"} <= set(commands)
    makefile = (project / "Makefile").read_text()
    for target, command in [
        ("lint", "ruff check ."),
        ("lint", "ruff format --check ."),
        ("typecheck", "mypy"),
    ]:
        recipe = rf"^{target}:\n(\t.*\n)*\t\$\(PYTHON\) -m {re.escape(command)}$"
        assert re.search(recipe, makefile, re.M), f"make {target} does not run {command}"


def test_outputs_and_tracker_stores_are_ignored(project):
    ignored = set((project / ".gitignore").read_text().split())
    assert {"outputs/", "demo/", "wandb/", "mlruns/", "mlflow.db", ".venv/"} <= ignored


def test_package_is_typed(project):
    package = "ddp_fine_tuning"
    assert (project / "src" / package / "py.typed").is_file()
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"][package]


@pytest.mark.slow
def test_pre_commit_hooks_pass_and_catch_a_lint_error(project, tmp_path: Path):
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"  # the project's environment, active: its ruff
    pre_commit = [str(VENV_BIN / "pre-commit"), "run", "--all-files"]
    for command in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(command, cwd=project, check=True)
    clean = run(pre_commit, cwd=project, env=env, timeout=600)
    assert clean.returncode == 0, describe(clean)

    module = project / "src" / "ddp_fine_tuning" / "doctor.py"
    original = module.read_text()
    try:
        module.write_text("import os\n" + original)  # an unused import
        subprocess.run(["git", "add", "-A"], cwd=project, check=True)
        dirty = run(pre_commit, cwd=project, env=env, timeout=600)
        assert dirty.returncode != 0 and "ruff" in dirty.stdout, describe(dirty)
    finally:
        module.write_text(original)
