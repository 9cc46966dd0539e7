"""Hosts whose own name resolves to loopback, or that have several interfaces, just work: the launcher
finds the address that routes to MASTER_ADDR and hands it to torchrun and gloo. Where no such address can
be chosen, node 0 refuses at once, in one line. On hosts emulated with network namespaces
(tests/emulated_hosts.py), both cases side by side:

- works: both hosts find their own name at 127.0.1.1 (Debian's default), and node 1 has a second
  interface on a network node 0 cannot reach; MASTER_ADDR=host0;
- refused: the same for node 0 with a second interface of its own, so its name tells nothing of which of
  its two addresses the other nodes reach.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest
from conftest import FAULT_RUN, PROJECT, launch_env
from emulated_hosts import SECOND_SUBNET, SUBNET, emulated_hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]

REFUSED_WITHIN_S = 30


def rendezvous(node: int, run_id: str) -> dict[str, str]:
    return {"NNODES": "2", "NODE_RANK": str(node), "MASTER_ADDR": "host0", "MASTER_PORT": "29500",
            "RUN_ID": run_id}  # fmt: skip


def test_loopback_host_names_and_second_interfaces(demo, tmp_path) -> None:
    if reason := unavailable():
        pytest.skip(reason)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    works, refused = tmp_path / "works", tmp_path / "refused"
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(
            emulated_hosts(["host0", "host1"], loopback_names={"host0", "host1"}, second_interface={"host1"})
        )
        (lone,) = stack.enter_context(
            emulated_hosts(["host0"], loopback_names={"host0"}, second_interface={"host0"})
        )
        args = [str(PROJECT / "launch.sh"), *demo[1], *FAULT_RUN, "train.max_steps=6"]
        started = time.monotonic()
        refusal_env = launch_env(1, **rendezvous(0, "refused"))
        refusal = subprocess.Popen(lone.command([*args, f"output_dir={refused}"]), env=refusal_env, **pipes)
        work = [*args, f"output_dir={works}"]
        nodes = [
            subprocess.Popen(host.command(work), env=launch_env(1, **rendezvous(i, "works")), **pipes)
            for i, host in enumerate(hosts)
        ]
        _, refusal_stderr = refusal.communicate(timeout=120)
        refused_after_s = time.monotonic() - started
        ends = [node.communicate(timeout=600) for node in nodes]

    assert refusal.returncode == 1, refusal_stderr[-3000:]
    assert refused_after_s < REFUSED_WITHIN_S, refusal_stderr[-3000:]
    assert refusal_stderr.strip().splitlines() == [
        "error: MASTER_ADDR=host0 resolves to 127.0.1.1, a loopback address, on host0, which has several "
        f"interfaces ({SUBNET}.1 (eth0), {SECOND_SUBNET}.0.1 (eth1)); set MASTER_ADDR to the address the "
        "other nodes reach host0 on (or GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to its interface)"
    ]
    assert not refused.exists()  # refused before anything was written

    settings = {name: value for name, value in os.environ.items() if name.endswith("SOCKET_IFNAME")}
    for node, (_, stderr) in zip(nodes, ends, strict=True):
        assert node.returncode == 0, f"{stderr[-4000:]}\nthis machine's interface settings: {settings}"
    assert (works / "final").is_dir()
