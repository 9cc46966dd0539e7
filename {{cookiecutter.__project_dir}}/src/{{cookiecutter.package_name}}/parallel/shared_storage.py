"""A multi-node job needs output_dir on storage every node shares: checked before step 1.

Only rank 0 writes checkpoints; every rank reads the newest one when the job resumes, and the
preprocessing cache that rank 0 fills. On a node-local disk (a Kubernetes emptyDir or hostPath, a node's
/tmp) training runs, then a resume finds nothing, or an older run's checkpoint, on the other nodes. So rank
0 writes a file in output_dir and every node looks for it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

from ..config import ConfigError
from .process_group import DistEnv, barrier, broadcast_object, gather_objects

# A new file may take a while to show on another node's NFS client (its attribute cache).
VISIBLE_WITHIN_S = 30.0


def require_shared_output_dir(output_dir: Path, env: DistEnv) -> None:
    """A collective: every rank of a job of several nodes sees what rank 0 writes in output_dir, or every
    rank raises the same ConfigError, which names the first node that does not."""
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) <= 1:
        return  # one node: one disk
    probe = output_dir / f".shared-storage-{broadcast_object(uuid.uuid4().hex, env)}"
    if env.is_main:
        probe.write_text(socket.gethostname(), encoding="utf-8")
    barrier()
    deadline = time.monotonic() + VISIBLE_WITHIN_S
    while not (seen := probe.exists()) and time.monotonic() < deadline:
        time.sleep(0.5)
    views = gather_objects((seen, int(os.environ.get("GROUP_RANK", "0")), socket.gethostname()), env)
    barrier()
    if env.is_main:
        probe.unlink(missing_ok=True)
    blind = [(node, host) for seen, node, host in views if not seen]
    if blind:
        node, host = blind[0]
        raise ConfigError(
            f"output_dir={output_dir} is not shared storage: node {node} ({host}) does not see what rank 0 "
            "writes there, so no node could resume from its checkpoints; put output_dir on storage every "
            "node mounts (NFS, a ReadWriteMany volume)"
        )
