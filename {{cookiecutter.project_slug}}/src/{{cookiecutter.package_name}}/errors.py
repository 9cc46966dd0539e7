"""How a run's errors reach the user: one line, shown once, whatever the number of processes."""

from __future__ import annotations

import os
import signal
import sys
import time

# A rank other than 0 waits this long before reporting an error: when every rank fails alike (a
# checkpoint that does not fit), torchrun stops it meanwhile and the job shows the error once.
ERROR_GRACE_S = 3.0


def report_error(message: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # let torchrun's stop end this rank at once
        time.sleep(ERROR_GRACE_S)
        message = f"[rank {rank}] {message}"
    print(message, file=sys.stderr, flush=True)
