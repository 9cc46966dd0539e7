"""Rendering from a git clone of the template (git does not keep launch.sh's mode for us), and re-rendering
a project from the answers it recorded in `.cookiecutter.json`.

The clone is made from a throwaway repository holding the current working tree, so uncommitted template
changes are what gets tested.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter
from template_helpers import (
    REPO,
    copy_template,
    describe,
    expected_files,
    list_files,
    read_tree,
    run,
    write_user_config,
)

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
# Answers that differ from every default, so a replay that fell back to defaults would show.
REPLAY_ANSWERS = {
    "project_name": 'Tom\'s Ünïcödé "Replay" Project',
    "model_type": "custom",
    "gpus_per_node": "8",
    "num_nodes": "3",
    "backend": "gloo",
    "precision": "fp16",
    "slurm": "yes",
    "kubernetes": "yes",
}


def git(*args: str, cwd) -> None:
    proc = run([*GIT, *args], cwd=cwd)
    assert proc.returncode == 0, describe(proc)


@pytest.fixture(scope="module")
def template_clone(tmp_path_factory):
    """A `git clone` of a repository that holds the working tree's template files."""
    source = tmp_path_factory.mktemp("template-repo")
    copy_template(source)
    git("init", "-q", "-b", "main", ".", cwd=source)
    git("add", "-A", cwd=source)
    git("commit", "-q", "-m", "template", cwd=source)
    clone = tmp_path_factory.mktemp("clone") / "template"
    git("clone", "-q", str(source), str(clone), cwd=source.parent)
    assert (clone / "cookiecutter.json").is_file()
    return clone


def render(template, output_dir, config_dir, **kwargs):
    output_dir.mkdir(parents=True, exist_ok=True)
    config_file = write_user_config(config_dir)
    return cookiecutter(str(template), output_dir=str(output_dir), config_file=str(config_file), **kwargs)


@pytest.mark.parametrize("model_type", ["text-classification", "custom"])
def test_render_from_git_clone_makes_launch_sh_executable(template_clone, tmp_path, model_type):
    project = render(
        template_clone,
        tmp_path / "out",
        tmp_path / "config",
        no_input=True,
        extra_context={"model_type": model_type},
    )
    project_path = tmp_path / "out" / "ddp-fine-tuning"
    assert os.path.samefile(project, project_path)
    assert os.access(project_path / "launch.sh", os.X_OK)
    assert list_files(project_path) == expected_files(model_type, "ddp_fine_tuning")


def test_git_clone_carries_every_template_file(template_clone):
    # Nothing the template needs is lost to a .gitignore on the way into git.
    template = REPO / "{{cookiecutter.__project_dir}}"
    working_tree = {
        path
        for path in list_files(template)
        if "__pycache__" not in path and not path.endswith(".pyc") and ".ruff_cache" not in path
    }
    assert list_files(template_clone / "{{cookiecutter.__project_dir}}") == working_tree


@pytest.mark.parametrize("how", ["api-copy-named-answers.json", "api-in-place", "cli-replay-file"])
def test_recorded_answers_replay_to_the_same_project(template_clone, tmp_path, how):
    first = render(
        template_clone,
        tmp_path / "first",
        tmp_path / "config-first",
        no_input=True,
        extra_context=REPLAY_ANSWERS,
    )
    recorded = Path(first) / ".cookiecutter.json"
    recorded_answers = json.loads(recorded.read_text(encoding="utf-8"))["cookiecutter"]
    assert recorded_answers["num_nodes"] == "3"
    assert recorded_answers["slurm"] is True and recorded_answers["kubernetes"] is True  # booleans, as asked

    if how == "cli-replay-file":
        # The command the README documents: cookiecutter --replay-file <project>/.cookiecutter.json <template>
        (tmp_path / "second").mkdir()
        config_file = write_user_config(tmp_path / "config-second")
        cmd = [sys.executable, "-m", "cookiecutter", "--config-file", str(config_file)]
        cmd += ["--replay-file", str(recorded), str(template_clone), "-o", str(tmp_path / "second")]
        proc = run(cmd, cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
    else:
        replay_path = recorded
        if how == "api-copy-named-answers.json":
            replay_path = tmp_path / "answers" / "answers.json"
            replay_path.parent.mkdir()
            shutil.copy(recorded, replay_path)
        render(template_clone, tmp_path / "second", tmp_path / "config-second", replay=str(replay_path))

    assert [p.name for p in (tmp_path / "second").iterdir()] == ["tom-s-unicode-replay-project"]
    assert Path(first).name == "tom-s-unicode-replay-project"
    first_tree, second_tree = read_tree(tmp_path / "first"), read_tree(tmp_path / "second")
    assert sorted(first_tree) == sorted(second_tree)
    differing = [path for path in first_tree if first_tree[path] != second_tree[path]]
    assert differing == []
