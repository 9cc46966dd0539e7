"""Whether torchrun started this process: read from its environment, without importing torch."""

from __future__ import annotations

import os


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ
