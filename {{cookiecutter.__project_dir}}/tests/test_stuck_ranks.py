"""A rank alive but stuck: when a collective times out, one line names the rank that never entered it,
and every rank's Python stacks are in output_dir/logs/. Unit tests of the line, then a deadlocked rank
under launch.sh: on one machine, and on two emulated hosts (tests/emulated_hosts.py), side by side."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
import traceback
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import FAULT_RUN, PROJECT, launch_env
from emulated_hosts import emulated_hosts, unavailable

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.parallel import (
    stuck_ranks,
)
from {{ cookiecutter.package_name }}.parallel.stuck_ranks import (
    Where,
    compose,
    where,
)

COLLECTIVES = stuck_ranks._COLLECTIVES
AUTOGRAD = stuck_ranks._AUTOGRAD
PROJECT_COLLECTIVES = stuck_ranks._PROJECT_COLLECTIVES
TRAINER = str(Path(stuck_ranks.__file__).parents[1] / "loop" / "trainer.py")
STACKS = Path("/out/logs/stacks-x-rank*.txt")


def frames(*places: tuple[str, int, str]) -> traceback.StackSummary:
    return traceback.StackSummary.from_list([traceback.FrameSummary(f, n, name) for f, n, name in places])


def test_where_a_rank_is_names_its_collective_and_the_code_that_called_it() -> None:
    caller = (TRAINER, 254, "log_training")
    in_torch = where(frames(caller, (COLLECTIVES + "distributed_c10d.py", 2800, "all_reduce")), rank=0)
    assert (in_torch.collective, in_torch.location) == ("all_reduce", "loop/trainer.py:254 in log_training")
    in_ours = where(frames(caller, (PROJECT_COLLECTIVES, 190, "wait_for")), rank=0)
    assert (in_ours.collective, in_ours.location) == ("wait_for", "loop/trainer.py:254 in log_training")
    backward = where(frames((TRAINER, 199, "optimizer_step"), (AUTOGRAD + "graph.py", 8, "_run")), rank=1)
    assert backward.collective == "backward (the gradients' all-reduce)"
    outside = where(frames(caller, ("/home/me/model.py", 12, "forward")), rank=1)
    assert (outside.collective, outside.location) == (None, "me/model.py:12 in forward")
    record = (COLLECTIVES + "elastic/multiprocessing/errors/__init__.py", 367, "wrapper")  # around main
    deadlocked = where(frames(record, caller, ("/home/me/model.py", 12, "forward")), rank=1)
    assert (deadlocked.collective, deadlocked.location) == (None, "me/model.py:12 in forward")
    waiting = where(frames(caller, (stuck_ranks._STDLIB + "threading.py", 320, "wait")), rank=1)
    assert waiting.location == "loop/trainer.py:254 in log_training"  # Python's own library: how, not who
    installed = stuck_ranks._STDLIB + "site-packages/transformers/x.py"
    assert where(frames(caller, (installed, 5, "f")), rank=1).location == "transformers/x.py:5 in f"


def test_the_line_names_the_rank_that_never_entered_the_collective() -> None:
    answers = {0: Where(0, "a", "loop/trainer.py:199 in optimizer_step", "backward"),
               1: Where(1, "b", "me/model.py:12 in forward", None)}  # fmt: skip
    assert compose(answers, 3, 20, STACKS) == (
        "error: a collective timed out after 20 s (distributed.timeout_s): rank 1 (b) never entered it: it "
        "is outside any collective, at me/model.py:12 in forward; rank 2 never answered (stuck without "
        "releasing the GIL, or gone); rank 0 waited in backward, called at loop/trainer.py:199 in "
        f"optimizer_step; every rank's Python stacks are in {STACKS}"
    )


def test_ranks_in_different_collectives_or_all_in_one_are_told_apart() -> None:
    barrier = Where(0, "a", "run.py:9 in main", "barrier")
    reduce = [Where(rank, "a", "loop/trainer.py:254 in log_training", "all_reduce") for rank in (1, 2)]
    different = compose({0: barrier, 1: reduce[0], 2: reduce[1]}, 3, 20, STACKS)
    assert different.split("(distributed.timeout_s): ", 1)[1].startswith(
        "the ranks wait in different collectives; rank 0 waited in barrier, called at run.py:9 in main; "
        "ranks 1, 2 waited in all_reduce, called at loop/trainer.py:254 in log_training; "
    )
    together = compose({0: replace(reduce[0], rank=0), 1: reduce[0]}, 2, 20, STACKS)
    assert "every rank entered it, and the messages between them never arrived (the network)" in together


def test_only_a_collective_timeout_is_explained() -> None:
    timed_out = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for recv")
    assert stuck_ranks.collective_timed_out(timed_out)
    assert stuck_ranks.collective_timed_out(RuntimeError("Application timeout caused pair closure"))
    assert not stuck_ranks.collective_timed_out(RuntimeError("Connection closed by peer [10.0.0.2]:3"))
    assert not stuck_ranks.collective_timed_out(ValueError("timed out"))


TIMEOUT_S = 10
# Rank 1 deadlocks after step 3 (a lock taken twice): the others wait in the next collective.
STUCK_RANK_1 = """
import os, threading
if os.environ.get("RANK") == "1":
    from {{ cookiecutter.package_name }}.loop import trainer
    after_step = trainer.Trainer.after_step

    def after_step_then_deadlock(self, *args, **kwargs):
        after_step(self, *args, **kwargs)
        if self.state.progress.step == 3:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # never returns: a deadlock outside any collective

    trainer.Trainer.after_step = after_step_then_deadlock
"""
DEADLOCK_LINE = next(n for n, line in enumerate(STUCK_RANK_1.splitlines(), 1) if "never returns" in line)


@pytest.mark.slow
@pytest.mark.ddp_guarantees
def test_a_deadlocked_rank_is_named_with_every_ranks_stacks(demo, tmp_path: Path) -> None:
    site = tmp_path / "stuck-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STUCK_RANK_1, encoding="utf-8")
    args = [str(PROJECT / "launch.sh"), *demo[1], *FAULT_RUN, f"distributed.timeout_s={TIMEOUT_S}"]
    python_path = {"PYTHONPATH": f"{site}{os.pathsep}{PROJECT / 'src'}"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    runs: dict[str, tuple[list[subprocess.Popen], Path, list[str]]] = {}
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        one = tmp_path / "one-host"
        alone = subprocess.Popen([*args, f"output_dir={one}"], env=launch_env(2, **python_path), **pipes)
        runs["one host"] = ([alone], one, [socket.gethostname()])
        if not unavailable():
            hosts = stack.enter_context(emulated_hosts(["host0", "host1"]))
            two = tmp_path / "two-hosts"
            rendezvous = {"NNODES": "2", "MASTER_ADDR": "host0", "MASTER_PORT": "29500", "RUN_ID": "stuck"}
            nodes = [
                subprocess.Popen(
                    host.command([*args, f"output_dir={two}"]),
                    env=launch_env(1, NODE_RANK=str(i), **rendezvous, **python_path),
                    **pipes,
                )
                for i, host in enumerate(hosts)
            ]
            runs["two hosts"] = (nodes, two, ["host0", "host1"])
        ends = {name: [process.communicate(timeout=300) for process in processes]
                for name, (processes, _, _) in runs.items()}  # fmt: skip
        took_s = time.monotonic() - started

    for name, (processes, output_dir, hostnames) in runs.items():
        logs = output_dir / "logs"
        stacks = sorted(logs.glob("stacks-*-rank*.txt"))
        stamp = stacks[0].name.split("-rank")[0] if stacks else "?"
        expected = re.compile(
            re.escape(
                f"error: a collective timed out after {TIMEOUT_S} s (distributed.timeout_s): rank 1 "
                f"({hostnames[-1]}) never entered it: it is outside any collective, at "
                f"stuck-site/sitecustomize.py:{DEADLOCK_LINE} in after_step_then_deadlock; rank 0 waited in "
            )
            + r".+, called at .+ in .+"
            + re.escape(f"; every rank's Python stacks are in {logs / stamp}-rank*.txt")
        )
        for process, (_, stderr) in zip(processes, ends[name], strict=True):
            assert process.returncode == 1, f"{name}: {stderr[-3000:]}"
            assert expected.fullmatch(stderr.strip().splitlines()[-1]), f"{name}: {stderr[-3000:]}"
        assert [path.name for path in stacks] == [f"{stamp}-rank0.txt", f"{stamp}-rank1.txt"], name
        stuck = stacks[1].read_text(encoding="utf-8")
        assert stuck.startswith(f"rank 1 on {hostnames[-1]}, outside any collective"), name
        assert 'Thread "MainThread"' in stuck and "in after_step_then_deadlock" in stuck, name
        timed_out = stacks[0].read_text(encoding="utf-8").rstrip().splitlines()[-1]  # the error's traceback
        assert timed_out.startswith("RuntimeError: ") and stuck_ranks.TIMED_OUT.search(timed_out), name
    assert took_s < TIMEOUT_S + 120
