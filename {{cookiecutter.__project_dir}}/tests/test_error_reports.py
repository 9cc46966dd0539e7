"""What the terminal shows when a run under launch.sh fails: the project's lines and nothing else, once,
whichever rank fails and however busy the machine; a bug's traceback in a file under output_dir.

Real torchrun with 2 gloo processes; ``INJECTED_FAILURE`` (conftest.py) makes one process fail. The runs
log at warning level, so the terminal holds exactly what the failure adds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ON_THIS_MACHINE, PACKAGE, QUIET, launch_env, run_launch

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_user_error_on_one_rank_is_shown_once(demo, failing, tmp_path: Path, rank: str) -> None:
    """The other rank, waiting for it in a collective, fails too: that is not shown."""
    result = run_launch([*demo[1], *QUIET, f"output_dir={tmp_path}"], **failing(rank, "data"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["error: injected.jsonl:3: missing field 'label'"]


def test_a_bug_shows_one_line_and_keeps_the_traceback_under_output_dir(demo, failing, tmp_path: Path) -> None:
    result = run_launch([*demo[1], *QUIET, f"output_dir={tmp_path}"], **failing("1", "bug"))
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1, result.stderr
    [line] = result.stderr.splitlines()
    prefix = "error: rank 1 failed with RuntimeError: an injected bug; the traceback is in "
    assert line.startswith(prefix), line
    log = Path(line.removeprefix(prefix))
    assert log.parent == tmp_path / "logs"
    text = log.read_text(encoding="utf-8")
    assert 'raise FAILURES[os.environ["INJECT_FAILURE"]]()' in text  # the worker's traceback
    assert "ChildFailedError" in text  # and torchrun's report


@pytest.mark.parametrize("launcher", ["launch.sh", "python -m"])
def test_a_full_disk_is_one_line(demo, failing, tmp_path: Path, launcher: str) -> None:
    expected = "error: /injected/step-00000001.pt: no space left on the device; free some space"
    args = [*demo[1], *QUIET, f"output_dir={tmp_path}"]
    if launcher == "launch.sh":
        result = run_launch(args, **failing("0", "disk"))
    else:
        command = [sys.executable, "-m", PACKAGE, *ON_THIS_MACHINE, *args]
        environment = launch_env(1, **failing("alone", "disk"))
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(expected), line
