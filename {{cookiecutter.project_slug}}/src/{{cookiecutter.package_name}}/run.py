"""One training run in this process, under torchrun or alone, once the pre-flight checks have passed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from .checkpoint import CheckpointError
from .config import Config, ConfigError
from .data import DataError
from .distributed import DistEnv, broadcast_object, distributed, launched_by_torchrun
from .errors import os_error_message, report_crash, report_error
from .launch_status import FINISHED, PREEMPTED, tell_launcher
from .lock import OutputDirBusy, OutputDirLock
from .log import log, setup_logging
from .model_type.task import TASK
from .preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from .trainer import Trainer

# Errors whose message is the whole report: the user's to fix, no traceback.
USER_ERRORS = (ConfigError, DataError, CheckpointError)


@record  # under a torchrun of your own, an unexpected exception's traceback is reported as the root cause
def run(config: Config) -> int:
    try:
        preemption = PreemptionWatch()
        with distributed(config.distributed) as env:
            setup_logging(env, config.log_level)
            with holding_output_dir(Path(config.output_dir), env):
                Trainer(config, TASK, env, preemption).fit()
    except Preempted as stop:
        if not tell_launcher(PREEMPTED, f"{stop}; run the same command to resume"):
            log.info(f"preempted: {stop}; run the same command again to resume")
        return 0 if launched_by_torchrun() else PREEMPTED_EXIT_CODE
    except Exception as error:
        message = str(error) if isinstance(error, USER_ERRORS) else os_error_message(error)
        if message is not None:
            report_error(f"error: {message}")
        elif not report_crash(error):
            raise
        return 1
    tell_launcher(FINISHED)
    return 0


@contextmanager
def holding_output_dir(output_dir: Path, env: DistEnv) -> Iterator[None]:
    """Global rank 0 holds output_dir's lock while the run lives; a refusal ends every rank alike."""
    lock, refusal = None, None
    if env.is_main:
        lock = OutputDirLock(output_dir, run_id=os.environ.get("TORCHELASTIC_RUN_ID", ""))
        try:
            lock.acquire()
        except (OutputDirBusy, OSError) as error:
            lock, refusal = None, os_error_message(error) or str(error)
    refusal = broadcast_object(refusal, env)
    if refusal is not None:
        raise OutputDirBusy(refusal)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
