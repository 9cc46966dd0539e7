"""The pre-generation hook's tables agree with what they describe: the choice lists of cookiecutter.json.

The hook cannot read them at render time (cookiecutter replaces each list by the chosen value), so it
keeps a copy.
"""

from __future__ import annotations

import json

from template_helpers import REPO

HOOK = REPO / "hooks" / "pre_gen_project.py"
ANSWERS_LINE = 'ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")'


def hook_namespace() -> dict:
    """The hook's module-level names, loaded without answers (its one Jinja line replaced)."""
    source = HOOK.read_text(encoding="utf-8")
    assert ANSWERS_LINE in source
    namespace = {"__name__": "pre_gen_project"}
    exec(compile(source.replace(ANSWERS_LINE, "ANSWERS = {}"), str(HOOK), "exec"), namespace)
    return namespace


def test_choices_equal_the_lists_in_cookiecutter_json():
    questions = json.loads((REPO / "cookiecutter.json").read_text(encoding="utf-8"))
    listed = {key: tuple(value) for key, value in questions.items() if isinstance(value, list)}
    listed = {key: value for key, value in listed.items() if not key.startswith("_")}
    assert hook_namespace()["CHOICES"] == listed
