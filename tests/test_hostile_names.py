"""Project names with quotes, backslashes, non-ASCII letters, emoji, control characters, line breaks, shell
syntax or odd spacing still render into a project that compiles, lints, whose pyproject.toml parses and
whose package metadata builds; checkpoint paths of any text load from defaults.yaml as written.
"""

from __future__ import annotations

import email.parser
import sys
import tomllib

import pytest
import yaml
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
    # JSON writes characters beyond the BMP as surrogate-pair escapes, which TOML and YAML reject.
    ("😀 Emoji Project 🤗", "emoji-project"),
    ('emoji "quoted" \\ 😀\\', "emoji-quoted"),
    ("ctl\x01 char\x7f and\ttab", "ctl-char-and-tab"),
    ("two\nlines\u2028more", "two-lines-more"),
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
    # A package summary is one line: line breaks become spaces, everything else is kept.
    one_line = " ".join(name.splitlines())
    assert pyproject["project"]["description"] == f"Distributed fine-tuning: {one_line}"
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(f"# {one_line}\n\n")

    for proc in (
        run([sys.executable, "-m", "compileall", "-q", "src"], cwd=root),
        ruff_check(root),
        bash_syntax_check(root / "launch.sh"),
        shellcheck(root / "launch.sh"),
    ):
        assert proc.returncode == 0, describe(proc)
        assert proc.stderr == "", describe(proc)
    assert not (root / "pwned").exists()
    # Last: building the metadata writes an egg-info folder into the project.
    assert build_metadata(root)["Summary"] == pyproject["project"]["description"]


def build_metadata(project):
    """The core metadata setuptools builds from pyproject.toml (what `pip install` reads), as a message."""
    code = (
        "import sys; from setuptools import build_meta; "
        "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    out = project.parent / f"{project.name}-metadata"
    out.mkdir()
    proc = run([sys.executable, "-c", code, str(out)], cwd=project)
    assert proc.returncode == 0, describe(proc)
    assert "Warning" not in proc.stderr, describe(proc)
    metadata = out / proc.stdout.strip().splitlines()[-1] / "METADATA"
    return email.parser.Parser().parsestr(metadata.read_text(encoding="utf-8"))


# Checkpoint paths are free text: a local folder may have any name.
HOSTILE_CHECKPOINTS = [
    "/models/😀 bert",
    'C:\\models\\"quoted" bert\\',
    "/models/tab\tand\x01ctl\x7f",
    "/models/two\nlines",
    "/models/yes: no # not a comment",
]


@pytest.mark.parametrize("checkpoint", HOSTILE_CHECKPOINTS, ids=range(len(HOSTILE_CHECKPOINTS)))
def test_hostile_checkpoint_path_loads_as_written(bake_ok, checkpoint):
    project = bake_ok(model_type="text-classification", pretrained_model=checkpoint)

    defaults = yaml.safe_load((project.package_dir / "config" / "defaults.yaml").read_text(encoding="utf-8"))
    assert defaults["model"]["pretrained"] == checkpoint
    assert project.answers["pretrained_model"] == checkpoint
