"""The template's own code (hooks, tests, bench) is lint-clean, as `make lint` checks it."""

from __future__ import annotations

import sys

import pytest
from template_helpers import REPO, describe, run

TEMPLATE_CODE = ["hooks", "tests", "bench"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_template_code_passes_ruff(command: list[str]) -> None:
    proc = run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", "--config", "ruff.toml", *TEMPLATE_CODE],
        cwd=REPO,
    )
    assert proc.returncode == 0, describe(proc)


def test_make_lint_checks_the_same_code() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert f"TEMPLATE_CODE = {' '.join(TEMPLATE_CODE)}" in makefile
