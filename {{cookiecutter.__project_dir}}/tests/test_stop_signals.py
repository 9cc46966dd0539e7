"""The launcher passes a stop signal sent to the whole job on to the workers by itself (launch/launcher.py),
whatever launch.sh's trap does, and no thread of it runs torchrun's handlers of those signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PACKAGE

# The launcher's state when torchrun runs: the stop signals blocked, the thread that takes them started.
LAUNCHER = f"""
import signal, sys, threading, time
from pathlib import Path
from {PACKAGE}.launch import launcher
signal.pthread_sigmask(signal.SIG_BLOCK, launcher.STOP_SIGNALS)
threading.Thread(target=launcher.pass_stop_signals_on, args=(Path(sys.argv[1]),), daemon=True).start()
print("ready", flush=True)
time.sleep(120)
"""


def test_the_launcher_starts_no_thread_before_it_blocks_the_stop_signals() -> None:
    """torch starts a thread when imported; one that does not block the signals would run torchrun's
    handlers. main() blocks them first, so importing the launcher must not import torch."""
    threads = "len(os.listdir('/proc/self/task'))"
    check = f"import os, sys, {PACKAGE}.launch.launcher; print('torch' in sys.modules, {threads})"
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "1"]


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=lambda n: n.name)
def test_a_signal_to_the_launcher_asks_the_workers_to_stop_and_leaves_it_running(
    tmp_path: Path, number: signal.Signals
) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "ready\n"
        os.kill(launcher.pid, number)
        deadline = time.monotonic() + 60
        while not (tmp_path / "stop").exists():
            assert time.monotonic() < deadline, "no stop request was written"
            time.sleep(0.01)
        assert (tmp_path / "stop").read_text(encoding="utf-8") == f"{number.name}\n"
        assert launcher.poll() is None  # torchrun goes on; the workers stop at a step they agree on
    finally:
        launcher.kill()
        launcher.wait()
