"""What the template's README promises about the tools it needs."""

from __future__ import annotations

import json
import re

from template_helpers import REPO

MINIMUM_COOKIECUTTER = (2, 2)  # yes/no (boolean) answers and __prompts__ arrived in cookiecutter 2.2


def test_readme_names_the_cookiecutter_version_the_questions_need():
    questions = json.loads((REPO / "cookiecutter.json").read_text(encoding="utf-8"))
    assert "__prompts__" in questions or any(isinstance(value, bool) for value in questions.values())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pip install 'cookiecutter>=2.2'" in readme
    assert "cookiecutter 2.2 or later" in readme

    pinned = re.search(r"^cookiecutter==(\d+)\.(\d+)", (REPO / "requirements-test.txt").read_text(), re.M)
    assert pinned is not None
    assert (int(pinned[1]), int(pinned[2])) >= MINIMUM_COOKIECUTTER, "the tests run an older cookiecutter"
