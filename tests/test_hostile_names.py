"""Project names with quotes, backslashes, non-ASCII letters, shell syntax or odd spacing still render
into a project that compiles, lints, and whose pyproject.toml parses.
"""

from __future__ import annotations

import sys
import tomllib

import pytest
from template_helpers import (
    bash_syntax_check,
    describe,
    expected_files,
    leftover_template_syntax,
    list_files,
    ruff_check,
    run,
    shellcheck,
)

# (project_name, the slug it must produce)
HOSTILE_NAMES = [
    ('Tom\'s "Fancy" Project', "tom-s-fancy-project"),
    ("back\\slash proj", "back-slash-proj"),
    ("trailing backslash\\", "trailing-backslash"),
    ("Ünïcödé Prøject", "unicode-project"),
    ("  spaced   out  name ", "spaced-out-name"),
    ("a'b\"c", "a-b-c"),
    ("triple \"\"\"quotes\"\"\" and '''more'''", "triple-quotes-and-more"),
    ("$(touch pwned) `id` ${HOME}; rm", "touch-pwned-id-home-rm"),
    ("<b>html</b> & co", "b-html-b-co"),
    # A long but ordinary name: lines that carry the package name must still fit ruff's line length.
    (
        "Distributed Fine-Tuning of Multilingual Sentiment Classifiers v2",
        "distributed-fine-tuning-of-multilingual-sentiment-classifiers-v2",
    ),
]


@pytest.mark.parametrize("name,slug", HOSTILE_NAMES, ids=[slug[:24] for _, slug in HOSTILE_NAMES])
@pytest.mark.parametrize("model_type", ["text-classification", "custom"])
def test_hostile_project_name_renders_a_working_project(bake_ok, name, slug, model_type):
    project = bake_ok(project_name=name, model_type=model_type)
    root = project.path

    assert root.name == slug
    assert project.answers["project_name"] == name
    assert project.answers["project_slug"] == slug
    assert project.package == slug.replace("-", "_")
    assert list_files(root) == expected_files(model_type, project.package)
    assert leftover_template_syntax(root) == []

    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["name"] == slug
    assert name in pyproject["project"]["description"]

    for proc in (
        run([sys.executable, "-m", "compileall", "-q", "src"], cwd=root),
        ruff_check(root),
        bash_syntax_check(root / "launch.sh"),
        shellcheck(root / "launch.sh"),
    ):
        assert proc.returncode == 0, describe(proc)
        assert proc.stderr == "", describe(proc)
    assert not (root / "pwned").exists()
