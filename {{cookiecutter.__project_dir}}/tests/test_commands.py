"""The side commands parse their arguments: help without side effects, misuse in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, PROJECT


def run_command(command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.{command}", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["demo", "plot", "doctor", "config_reference", "predict"])
def test_help_has_no_side_effects(command: str, tmp_path: Path) -> None:
    result = run_command(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # argparse wraps the usage after a long program name: compare the words, not the lines.
    assert " ".join(result.stdout.split()).startswith(f"usage: python -m {PACKAGE}.{command} [-h]")
    assert list(tmp_path.iterdir()) == []  # e.g. no folder named --help


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("config_reference", ["--chek"]),
        ("demo", ["a", "b"]),
        ("predict", ["final", "in", "--batch-size", "0"]),
    ],
)
def test_misuse_is_one_line(command: str, args: list[str], tmp_path: Path) -> None:
    result = run_command(command, *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert list(tmp_path.iterdir()) == []
