"""The project's logger: rank 0 logs at the configured level, the other ranks warnings and errors only.

Modules below this room (parallel/) log through ``logging.getLogger(__name__)``, a child of this logger.
"""

from __future__ import annotations

import logging
import sys

from ..config import LogLevel
from ..config.constants import PACKAGE
from ..parallel.process_group import DistEnv

log = logging.getLogger(PACKAGE)


def setup_logging(env: DistEnv, level: LogLevel = LogLevel.info) -> None:
    """Rank 0 logs at ``level``; the other ranks only warnings and errors, tagged with their rank."""
    handler = logging.StreamHandler(sys.stderr)
    tag = "" if env.is_main else f"[rank {env.rank}] "
    handler.setFormatter(logging.Formatter(f"%(asctime)s {tag}%(message)s", "%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(getattr(logging, level.value.upper()) if env.is_main else logging.WARNING)
    log.propagate = False
