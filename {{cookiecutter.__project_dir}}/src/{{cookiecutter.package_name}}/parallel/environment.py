"""Whether torchrun started this process: read from its environment, without importing torch."""

from __future__ import annotations

import os


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


# In launch.sh's status folder: a lost node's verdict, for every process of this node and its launcher
# (parallel/liveness.py writes it, launch/launcher.py reads it).
LOST_NODE_FILE = "lost"
# There too: the watch of lost nodes has started (the job had formed), and what it last saw.
LIVENESS_STATE_FILE = "liveness"
