"""Fixtures of the template tests. Data and tool runners live in template_helpers.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from template_helpers import REPO, write_user_config


class Rendered:
    """A project that rendered without error, with the answers cookiecutter recorded in it."""

    def __init__(self, path: Path):
        self.path = path
        self.recorded = json.loads((path / ".cookiecutter.json").read_text(encoding="utf-8"))
        self.answers: dict[str, str] = self.recorded["cookiecutter"]
        self.package: str = self.answers["package_name"]
        self.package_dir = path / "src" / self.package


def expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("expected_s")
    return float(marker.args[0]) if marker else 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The items marked with the seconds they take go first, the longest first; the others keep their
    order (a stable sort). With one item sent at a time (pytest.ini), the workers end together, where the
    collection order had one worker start a 13-minute suite after most of the rest was done."""
    items.sort(key=expected_seconds, reverse=True)


def require_rendered(result) -> Rendered:
    """The project of a pytest-cookies result; fails the test with the exception when baking failed."""
    assert result.exception is None, f"rendering failed: {result.exception!r}"
    assert result.exit_code == 0
    assert result.project_path is not None and result.project_path.is_dir()
    return Rendered(result.project_path)


@pytest.fixture
def bake(cookies) -> Callable:
    """`bake(**answers)`: render this repository's template with pytest-cookies."""

    def _bake(**answers: str):
        return cookies.bake(extra_context=answers, template=str(REPO))

    return _bake


@pytest.fixture
def bake_ok(bake) -> Callable[..., Rendered]:
    """`bake_ok(**answers)`: render and require success."""
    return lambda **answers: require_rendered(bake(**answers))


@pytest.fixture
def user_config(tmp_path) -> Path:
    """A cookiecutter config file whose replay and clone folders are private to the test."""
    return write_user_config(tmp_path / "cookiecutter-user")
