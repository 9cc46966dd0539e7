"""Pulling later template fixes into a project with cruft: the fix arrives, the user's own edits stay.

Two ways in: a project made with `cruft create`, and one rendered with plain cookiecutter and linked
afterwards with `cruft link`, from the answers the post-gen hook recorded in `.cookiecutter.json`. The
template is a throwaway git repository holding the working tree's template files, so uncommitted
template changes are what gets tested; the hooks run under cruft as they do under cookiecutter.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from template_helpers import (
    CLUSTER_FILES,
    VENV_BIN,
    cookiecutter_cli,
    copy_template,
    describe,
    expected_files,
    list_files,
    run,
    write_user_config,
)

pytestmark = pytest.mark.slow

CRUFT = str(VENV_BIN / "cruft")
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
ANSWERS = {
    "model_type": "custom",
    "gpus_per_node": "0",
    "backend": "gloo",
    "precision": "fp32",
    "slurm": "yes",
}
PACKAGE = "ddp_fine_tuning"
TEMPLATE_README = "{{cookiecutter.__project_dir}}/README.md"
TEMPLATE_MODEL = "{{cookiecutter.__project_dir}}/src/{{cookiecutter.package_name}}/parallel/ddp.py"
TEMPLATE_FIX = "# A template fix released after the project was rendered.\n"
USER_EDIT = "# The user's own line, near the top of a file the template fix also changes.\n"


def git(*args: str, cwd: Path) -> str:
    proc = run([*GIT, *args], cwd=cwd)
    assert proc.returncode == 0, describe(proc)
    return proc.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # cruft reads the cookiecutter user config only from COOKIECUTTER_CONFIG or the home directory.
    config = write_user_config(tmp_path / "cookiecutter-user")
    return {**os.environ, "COOKIECUTTER_CONFIG": str(config)}


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """A git repository of the working tree's template, one commit."""
    repo = tmp_path / "template"
    repo.mkdir()
    copy_template(repo)
    git("init", "-q", "-b", "main", ".", cwd=repo)
    commit_all(repo, "template")
    return repo


def cruft(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run([CRUFT, *args], cwd=cwd, env=env, timeout=300)


def start_project(project: Path) -> None:
    """What a user does after rendering: a git repository, then edits of their own, committed."""
    git("init", "-q", "-b", "main", ".", cwd=project)
    commit_all(project, "rendered")
    model = project / "src" / PACKAGE / "parallel" / "ddp.py"
    lines = model.read_text(encoding="utf-8").splitlines(keepends=True)
    model.write_text("".join([lines[0], USER_EDIT, *lines[1:]]), encoding="utf-8")
    (project / "NOTES.md").write_text("the user's own file\n", encoding="utf-8")
    commit_all(project, "user edits")


def release_template_fix(template: Path) -> str:
    for relative in (TEMPLATE_README, TEMPLATE_MODEL):
        with (template / relative).open("a", encoding="utf-8") as handle:
            handle.write(TEMPLATE_FIX)
    return commit_all(template, "template fix")


def update_and_check(project: Path, fix_commit: str, env: dict[str, str]) -> None:
    recorded = (project / ".cookiecutter.json").read_bytes()
    stale = cruft("check", cwd=project, env=env)
    assert stale.returncode == 1 and "out of date" in stale.stdout, describe(stale)

    updated = cruft("update", "--skip-apply-ask", cwd=project, env=env)
    assert updated.returncode == 0, describe(updated)
    assert not list(project.rglob("*.rej")), "the update conflicted:\n" + describe(updated)
    model = (project / "src" / PACKAGE / "parallel" / "ddp.py").read_text(encoding="utf-8")
    assert USER_EDIT in model and model.endswith(TEMPLATE_FIX)  # both, merged in one file
    assert (project / "README.md").read_text(encoding="utf-8").endswith(TEMPLATE_FIX)
    assert (project / "NOTES.md").is_file()
    assert json.loads((project / ".cruft.json").read_text(encoding="utf-8"))["commit"] == fix_commit
    # The recorded answers hold no template commit, so an update leaves them alone.
    assert (project / ".cookiecutter.json").read_bytes() == recorded

    commit_all(project, "cruft update")
    current = cruft("check", cwd=project, env=env)
    assert current.returncode == 0 and "up to date" in current.stdout, describe(current)


def test_cruft_create_then_update(template: Path, tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    created = cruft(
        "create",
        "--no-input",
        str(template),
        "--output-dir",
        str(out),
        "--extra-context",
        json.dumps(ANSWERS),
        cwd=tmp_path,
        env=env,
    )
    assert created.returncode == 0, describe(created)
    project = out / "ddp-fine-tuning"
    # The hooks ran under cruft: the unchosen options' files are gone, the answers recorded.
    files = list_files(project)
    assert ".cruft.json" in files, "cruft create records the template it came from"
    assert files - {".cruft.json"} == expected_files("custom", PACKAGE, slurm=True)
    assert not [path for path in files if path.startswith("model_types/")]
    assert not set(CLUSTER_FILES["kubernetes"]) & files
    recorded = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))["cookiecutter"]
    assert recorded["slurm"] is True and recorded["backend"] == "gloo"
    assert "_commit" not in recorded
    assert os.access(project / "launch.sh", os.X_OK)

    start_project(project)
    update_and_check(project, release_template_fix(template), env)


def test_cookiecutter_project_links_then_updates(template: Path, tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    rendered = cookiecutter_cli(ANSWERS, out, Path(env["COOKIECUTTER_CONFIG"]), template=template)
    assert rendered.returncode == 0, describe(rendered)
    project = out / "ddp-fine-tuning"
    start_project(project)
    rendered_from = git("rev-parse", "HEAD", cwd=template)
    fix_commit = release_template_fix(template)

    # Linking takes the answers recorded at render time, and the template commit rendered from.
    answers = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))["cookiecutter"]
    linked = cruft(
        "link",
        str(template),
        "--no-input",
        "--checkout",
        rendered_from,
        "--extra-context",
        json.dumps(answers),
        cwd=project,
        env=env,
    )
    assert linked.returncode == 0, describe(linked)
    # Those answers re-render the project exactly: the user's edit is the only difference.
    diff = cruft("diff", "--exit-code", cwd=project, env=env)
    changed = [line.split()[-1] for line in diff.stdout.splitlines() if line.startswith("diff --git")]
    assert changed == [f"upstream-template-new/src/{PACKAGE}/parallel/ddp.py"], describe(diff)
    commit_all(project, "cruft link")

    update_and_check(project, fix_commit, env)
