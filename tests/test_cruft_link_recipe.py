"""The `cruft link` recipe of the template's README and of a generated project's, run as written: it links
a project from its recorded answers, and it does not run Jinja planted in them.

cruft renders every answer it is given as Jinja (on `link`, and on every `update`), and the template's
Jinja environment is not sandboxed, so an edited `.cookiecutter.json` could run any code. Answers this
template records never hold Jinja (the pre-gen hook refuses them), so the recipe refuses any that do.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from template_helpers import REPO, VENV_BIN, copy_template, describe, run, write_user_config

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
# The placeholders of the template's README and of a generated project's README.
TEMPLATE_URLS = ("https://github.com/<org>/<repo>", "<template git URL>")
COMMITS = ("<commit you rendered from>", "<that commit>")
ANSWERS = {"project_name": "Linked Project", "model_type": "custom", "gpus_per_node": "0", "backend": "gloo"}
# Creates the file `pwned` in the working directory when rendered by cookiecutter's Jinja environment.
PAYLOAD = "{{ cycler.__init__.__globals__.os.system('touch pwned') }}"
# From the answers check to the end of the `cruft link` command.
RECIPE = re.compile(
    r"""^answers="\$\(python - <<'EOF'$.*?--extra-context "\$answers"$""", re.DOTALL | re.MULTILINE
)


def link_recipe(readme: str) -> str:
    """The README's commands that check the recorded answers and run `cruft link` with them."""
    recipes = RECIPE.findall(readme)
    assert len(recipes) == 1, "the README should show one `cruft link` recipe"
    return recipes[0]


@pytest.fixture(params=["template README", "generated README"])
def recipe(request, bake_ok) -> str:
    if request.param == "template README":
        return link_recipe((REPO / "README.md").read_text(encoding="utf-8"))
    project = bake_ok(model_type="custom", gpus_per_node="0", backend="gloo")
    return link_recipe((project.path / "README.md").read_text(encoding="utf-8"))


@pytest.fixture
def template(tmp_path: Path) -> tuple[Path, str]:
    """A git repository of the working tree's template, and its commit."""
    repo = tmp_path / "template"
    repo.mkdir()
    copy_template(repo)
    for args in (["init", "-q", "-b", "main", "."], ["add", "-A"], ["commit", "-q", "-m", "template"]):
        proc = run([*GIT, *args], cwd=repo)
        assert proc.returncode == 0, describe(proc)
    return repo, run(["git", "rev-parse", "HEAD"], cwd=repo).stdout.strip()


def run_recipe(recipe: str, template: tuple[Path, str], answers: dict, tmp_path: Path):
    """The recipe in a project folder holding `answers` as its `.cookiecutter.json`."""
    repo, commit = template
    project = tmp_path / "project"
    project.mkdir()
    recorded = json.dumps({"cookiecutter": answers}, indent=2, ensure_ascii=False)
    (project / ".cookiecutter.json").write_text(recorded + "\n", encoding="utf-8")
    script = recipe
    for placeholder in TEMPLATE_URLS:
        script = script.replace(placeholder, str(repo))
    for placeholder in COMMITS:
        script = script.replace(placeholder, commit)
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "COOKIECUTTER_CONFIG": str(write_user_config(tmp_path / "cookiecutter-user")),
    }
    return run(["bash", "-c", script], cwd=project, env=env, timeout=300), project


def test_recipe_links_the_recorded_answers(recipe, template, tmp_path):
    proc, project = run_recipe(recipe, template, ANSWERS, tmp_path)

    assert proc.returncode == 0, describe(proc)
    linked = json.loads((project / ".cruft.json").read_text(encoding="utf-8"))
    assert linked["commit"] == template[1]
    for key, value in ANSWERS.items():
        assert linked["context"]["cookiecutter"][key] == value, key


@pytest.mark.parametrize("key", ["project_name", "__kubernetes_name"])
def test_recipe_refuses_answers_holding_jinja_without_running_them(recipe, template, tmp_path, key):
    proc, project = run_recipe(recipe, template, {**ANSWERS, key: PAYLOAD}, tmp_path)

    assert not (project / "pwned").exists(), "the recipe ran Jinja from .cookiecutter.json"
    assert proc.returncode != 0, describe(proc)
    assert key in proc.stderr, describe(proc)
    assert not (project / ".cruft.json").exists()
