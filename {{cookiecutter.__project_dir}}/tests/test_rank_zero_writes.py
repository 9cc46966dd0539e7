"""Only global rank 0 writes under output_dir, proved by auditing every file the other ranks open.

A ``sitecustomize`` module on PYTHONPATH installs a Python audit hook in every process of the run; in
processes whose RANK is not 0 it logs each open for writing of a path under output_dir. The log must
stay empty; a self-check proves the hook sees such writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import launch_env, run_launch

pytestmark = pytest.mark.slow

AUDIT = """
import os
import sys

if os.environ.get("RANK", "0") != "0" and "AUDIT_OUTPUT_DIR" in os.environ:
    WATCHED = os.path.realpath(os.environ["AUDIT_OUTPUT_DIR"])
    LOG = os.environ["AUDIT_LOG"]
    WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def audit(event, args):
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path, mode, flags = args
        writing = any(letter in (mode or "") for letter in "wax+") or bool((flags or 0) & WRITING)
        resolved = os.path.realpath(os.fsdecode(path))
        if writing and (resolved == WATCHED or resolved.startswith(WATCHED + os.sep)):
            with open(LOG, "a") as log:
                log.write(f"rank {os.environ['RANK']}: {resolved} ({mode or flags})\\n")

    sys.addaudithook(audit)
"""


@pytest.fixture
def audited_env(tmp_path: Path) -> dict[str, str]:
    hook_dir = tmp_path / "audit"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(AUDIT)
    output_dir = tmp_path / "run"
    return {
        "PYTHONPATH": f"{hook_dir}{os.pathsep}{launch_env(2)['PYTHONPATH']}",
        "AUDIT_OUTPUT_DIR": str(output_dir),
        "AUDIT_LOG": str(tmp_path / "audit.log"),
    }


def test_the_audit_sees_a_write_by_another_rank(audited_env: dict[str, str]) -> None:
    output_dir = Path(audited_env["AUDIT_OUTPUT_DIR"])
    output_dir.mkdir()
    writer = f"open({str(output_dir / 'x')!r}, 'w').close()"
    env = {**os.environ, **audited_env, "RANK": "1"}
    subprocess.run([sys.executable, "-c", writer], env=env, check=True, timeout=60)
    assert "rank 1:" in Path(audited_env["AUDIT_LOG"]).read_text()


def test_only_rank_zero_opens_files_under_output_dir_for_writing(demo, audited_env: dict[str, str]) -> None:
    run = [
        *demo[1],
        f"output_dir={audited_env['AUDIT_OUTPUT_DIR']}",
        "train.max_steps=4",
        "checkpoint.every_steps=2",
    ]
    result = run_launch(run, **audited_env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (Path(audited_env["AUDIT_OUTPUT_DIR"]) / "final").is_dir()
    log = Path(audited_env["AUDIT_LOG"])
    assert not log.exists(), log.read_text()
