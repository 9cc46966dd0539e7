"""``python -m <package>.predict`` in the model types' tests: in this process, or as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, PROJECT

from {{ cookiecutter.package_name }} import predict


def predictions(model_dir: Path, inputs: Path, output: Path, *options: str) -> list[dict]:
    """The records predict writes for ``inputs``, one per line."""
    assert predict.main([str(model_dir), str(inputs), "--output", str(output), *options]) == 0
    return [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]


def prediction_error(model_dir: Path, inputs: Path, capsys: pytest.CaptureFixture[str], *options: str) -> str:
    """The one line predict prints when it refuses ``inputs`` (exit status 1, nothing written)."""
    assert predict.main([str(model_dir), str(inputs), *options]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    return captured.err.rstrip("\n")


def run_predict(*args: str) -> subprocess.CompletedProcess:
    """The command line, as the README shows it."""
    env = {**os.environ, "PYTHONPATH": f"{PROJECT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", f"{PACKAGE}.predict", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
