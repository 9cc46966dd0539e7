"""The pre-generation hook's tables agree with what they describe: the choice lists of cookiecutter.json,
and the import and distribution names of everything a generated project installs.

The hook cannot read either at render time (cookiecutter replaces each list by the chosen value, and the
dependencies need not be installed where the template is rendered), so it keeps copies; these tests
compute the real thing and compare.
"""

from __future__ import annotations

import json
import re
import tomllib
from importlib import metadata

import pytest
from cookiecutter.generate import generate_context
from cookiecutter.prompt import prompt_for_config
from cookiecutter.utils import create_env_with_context
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from template_helpers import MODEL_TYPES, REPO, TEMPLATE_DIR_NAME, TRACKERS

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


def rendered_pyproject(model_type: str, tracker: str, finetune: str = "full") -> dict:
    """The generated pyproject.toml for these answers, rendered as cookiecutter renders it."""
    context = generate_context(
        context_file=str(REPO / "cookiecutter.json"),
        extra_context={"model_type": model_type, "tracker": tracker, "finetune": finetune},
    )
    context["cookiecutter"] = prompt_for_config(context, no_input=True)
    template = (REPO / TEMPLATE_DIR_NAME / "pyproject.toml").read_text(encoding="utf-8")
    text = create_env_with_context(context).from_string(template).render(**context)
    return tomllib.loads(text)


def installed_closure(requirements: list[str]) -> set[str]:
    """Canonical names of the distributions these requirements install, transitively, on this machine."""
    found: dict[str, set[str]] = {}  # name -> the extras asked of it
    pending = [Requirement(text) for text in requirements]
    missing = []
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in found and set(requirement.extras) <= found[name]:
            continue
        extras = found.setdefault(name, set())
        extras |= set(requirement.extras)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        for text in requires:
            sub = Requirement(text)
            environments = [{"extra": extra} for extra in extras or {""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in environments):
                pending.append(sub)
    assert missing == [], "the test environment lacks these dependencies of a generated project"
    return set(found)


def dependency_name(name: str) -> str:
    """The hook's spelling: lower case, runs of '-', '_', '.' as '_'."""
    return re.sub(r"[-_.]+", "_", name).lower()


# finetune=lora adds peft (custom refuses it); the trackers add the same packages to any model type.
DEPENDENCY_CASES = [
    *((model_type, tracker, "full") for model_type in MODEL_TYPES for tracker in TRACKERS),
    *((model_type, "none", "lora") for model_type in MODEL_TYPES if model_type != "custom"),
]


@pytest.mark.parametrize("model_type,tracker,finetune", DEPENDENCY_CASES)
def test_dependency_names_cover_the_installed_closure(model_type, tracker, finetune):
    project = rendered_pyproject(model_type, tracker, finetune)["project"]
    requirements = project["dependencies"] + [
        text for extra in project["optional-dependencies"].values() for text in extra
    ]
    distributions = installed_closure(requirements)
    import_names = {
        module
        for module, owners in metadata.packages_distributions().items()
        if module.isidentifier() and {canonicalize_name(owner) for owner in owners} & distributions
    }
    needed = {dependency_name(name) for name in distributions | import_names}

    assert sorted(needed - hook_namespace()["DEPENDENCY_NAMES"]) == []


def test_dependency_names_are_one_sorted_block():
    source = HOOK.read_text(encoding="utf-8")
    block = re.search(r'DEPENDENCY_NAMES = frozenset\(\n    """(.*?)"""', source, flags=re.DOTALL)
    assert block is not None
    names = block.group(1).split()
    assert names == sorted(set(names))
    assert names == [dependency_name(name) for name in names]
