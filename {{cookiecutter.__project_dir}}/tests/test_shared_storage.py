"""A multi-node job whose output_dir is on a node-local disk (a Kubernetes emptyDir, a node's /tmp) is
refused before step 1, in one line that names the node and says what output_dir must be: on 2 emulated
hosts (tests/emulated_hosts.py), node 1 with a disk of its own where output_dir is."""

from __future__ import annotations

import subprocess

import pytest
from conftest import FAULT_RUN, PROJECT, launch_env
from emulated_hosts import emulated_hosts, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]


def test_output_dir_on_a_node_local_disk_is_refused_before_step_1(demo, tmp_path) -> None:
    if reason := unavailable():
        pytest.skip(reason)
    disk = tmp_path / "disk"
    disk.mkdir()
    args = [str(PROJECT / "launch.sh"), *demo[1], *FAULT_RUN, f"output_dir={disk / 'run'}"]
    # Node 1 mounts a disk of its own over the folder (in the mount namespace `ip netns exec` gives it).
    own_disk = ["sh", "-c", 'mount -t tmpfs node-local "$0" && exec "$@"', str(disk), *args]
    with emulated_hosts(["host0", "host1"]) as hosts:
        processes = []
        for node, (host, argv) in enumerate(zip(hosts, [args, own_disk], strict=True)):
            rendezvous = {"NNODES": "2", "NODE_RANK": str(node), "MASTER_ADDR": "host0",
                          "MASTER_PORT": "29500", "RUN_ID": "local-disk"}  # fmt: skip
            env = launch_env(1, **rendezvous)
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
            processes.append(subprocess.Popen(host.command(argv), env=env, **pipes))
        ends = [process.communicate(timeout=600) for process in processes]
    for process, (_, stderr) in zip(processes, ends, strict=True):
        assert process.returncode == 1, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert errors == [
            f"error: output_dir={disk / 'run'} is not shared storage: node 1 (host1) does not see what "
            "rank 0 writes there, so no node could resume from its checkpoints; put output_dir on storage "
            "every node mounts (NFS, a ReadWriteMany volume)"
        ], stderr[-3000:]
    assert not list((disk / "run").glob("checkpoints/*"))  # refused before step 1
