"""Entry point: ``python -m <package> [key=value ...]``, one process, or many under ``torchrun``.

Configuration and data paths are checked before any process group exists, so a mistake ends the job
in seconds with one line naming the key, instead of after a rendezvous.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record

from .checkpoint import CheckpointError
from .config import ConfigError, load_config
from .data import DataError
from .distributed import distributed, launched_by_torchrun, resolve_device
from .metrics import log, setup_logging
from .preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from .tasks import load_task
from .trackers import check_tracker
from .trainer import Trainer

USAGE = """usage: python -m {package} [key=value ...]

Trains with the defaults in {package}/defaults.yaml, each key=value overriding one of them,
e.g. train.lr=1e-4 data.batch_size=8 output_dir=outputs/run2. Run under torchrun (see launch.sh)
for more than one process.

  --check   validate the configuration and data paths, then exit (0 when the run can start)"""


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


@record  # under torchrun, an unexpected exception's traceback is reported once, as the root cause
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in args):
        print(USAGE.format(package=__package__))
        return 0
    check_only = "--check" in args
    try:
        config = load_config([arg for arg in args if arg != "--check"])
        task = load_task()
        task.check_config(config)
        check_tracker(config.tracker)
        if check_only:
            resolve_device(config.distributed, local_rank=0)  # e.g. CUDA asked for on a CPU machine
            return 0
        preemption = PreemptionWatch()
        with distributed(config.distributed) as env:
            setup_logging(env, config.log_level)
            Trainer(config, task, env, preemption).fit()
    except (ConfigError, DataError, CheckpointError) as error:
        report_error(f"error: {error}")
        return 1
    except Preempted as stop:
        log.info(f"preempted: {stop}; run the same command again to resume")
        return 0 if launched_by_torchrun() else PREEMPTED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
