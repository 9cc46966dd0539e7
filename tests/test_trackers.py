"""The tracker answer: its files, its dependencies only when chosen, its default in the config; and, slow,
each tracker fed by rank 0 of a real two-process run (the project's own tests/test_tracker.py, offline)."""

from __future__ import annotations

import tomllib

import pytest
import yaml
from template_helpers import (
    MODEL_TYPES,
    TRACKERS,
    describe,
    expected_files,
    list_files,
    ruff_check,
    ruff_format_check,
    run_generated_suite,
)
from test_generated_project_slow import CPU_ANSWERS, project_env

# The distribution each tracker needs in the generated project's dependencies.
TRACKER_REQUIREMENTS = {
    "none": set(),
    "tensorboard": {"tensorboard"},
    "wandb": {"wandb"},
    "mlflow": {"mlflow-skinny", "sqlalchemy", "alembic"},
}
ALL_TRACKER_REQUIREMENTS = set().union(*TRACKER_REQUIREMENTS.values())


def requirement_names(project) -> set[str]:
    pyproject = tomllib.loads((project.path / "pyproject.toml").read_text(encoding="utf-8"))
    return {item.split(">")[0].split("=")[0].strip() for item in pyproject["project"]["dependencies"]}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("tracker", TRACKERS)
def test_tracker_answer_renders_a_clean_project(bake_ok, tracker, model_type):
    project = bake_ok(tracker=tracker, model_type=model_type)
    assert list_files(project.path) == expected_files(model_type, project.package, tracker=tracker)
    assert requirement_names(project) & ALL_TRACKER_REQUIREMENTS == TRACKER_REQUIREMENTS[tracker]
    defaults = yaml.safe_load((project.package_dir / "config" / "defaults.yaml").read_text())
    assert defaults["tracker"] == {"name": tracker, "project": "ddp-fine-tuning", "run_name": ""}
    for proc in (ruff_check(project.path), ruff_format_check(project.path)):
        assert proc.returncode == 0, describe(proc)


def test_unknown_tracker_is_refused(bake):
    result = bake(tracker="neptune")
    assert result.exception is not None and result.project_path is None


@pytest.mark.slow
@pytest.mark.expected_s(18)
@pytest.mark.parametrize("tracker", [t for t in TRACKERS if t != "none"])
def test_rank_0_feeds_the_chosen_tracker(bake_ok, tracker):
    project = bake_ok(tracker=tracker, model_type="custom", **CPU_ANSWERS)
    proc = run_generated_suite(project.path, ["-x", "tests/test_tracker.py"], project_env(project.path))
    assert proc.returncode == 0, describe(proc)
