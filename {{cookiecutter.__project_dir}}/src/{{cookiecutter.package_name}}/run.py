"""One training run in this process, under torchrun or alone, once the pre-flight checks have passed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from .config import Config, ConfigError
from .data.loader import DataError
from .launch.errors import os_error_message, report_crash, report_error
from .launch.lock import OutputDirBusy, OutputDirLock
from .launch.preemption import Preempted, PreemptionWatch
from .launch.status import FINISHED, PREEMPTED, PREEMPTED_EXIT_CODE, USER_ERROR, status_dir, tell_launcher
from .loop.trainer import Trainer
from .model_type.task import TASK
from .observe.log import log, setup_logging
from .observe.phases import phases
from .parallel import liveness, stuck_ranks
from .parallel.checkpoint import CheckpointError, describe_newest
from .parallel.elastic import keep_global_batch
from .parallel.process_group import DistEnv, broadcast_object, distributed, launched_by_torchrun
from .parallel.shared_storage import require_shared_output_dir

# Errors whose message is the whole report: the user's to fix, no traceback.
USER_ERRORS = (ConfigError, DataError, CheckpointError)


@record  # under a torchrun of your own, an unexpected exception's traceback is reported as the root cause
def run(config: Config) -> int:
    phases.mark("python and imports")
    try:
        preemption = PreemptionWatch()
        with distributed(config.distributed) as env:
            setup_logging(env, config.log_level)
            phases.mark("process group")
            config = keep_global_batch(config, env.world_size)  # an elastic job on fewer nodes
            checkpoints = Path(config.output_dir) / "checkpoints"
            liveness.start(
                config.distributed.node_timeout_s,
                describe_checkpoint=lambda: describe_newest(checkpoints),
                status=status_dir(),
                tell=lambda message: tell_launcher(PREEMPTED, message),
            )
            stuck_ranks.start(Path(config.output_dir), tell=lambda line: tell_launcher(USER_ERROR, line))
            return train_and_report(config, env, preemption)
    except Exception as error:  # before the process group exists: no peer can fail because of it
        return report(error)


def train_and_report(config: Config, env: DistEnv, preemption: PreemptionWatch) -> int:
    """Train, and report how it ended while the process group is still up. A peer waiting in a collective
    fails only once this process leaves the group, so the launcher always holds the cause's report
    before the reports of the ranks that failed because of it."""
    try:
        with holding_output_dir(Path(config.output_dir), env):
            require_shared_output_dir(Path(config.output_dir), env)
            Trainer(config, TASK, env, preemption).fit()
    except Preempted as stop:
        liveness.stop()
        if not tell_launcher(PREEMPTED, f"{stop}; run the same command to resume"):
            log.info(f"preempted: {stop}; run the same command again to resume")
        return 0 if launched_by_torchrun() else PREEMPTED_EXIT_CODE
    except Exception as error:
        stuck_ranks.timed_out(error)
        if not isinstance(error, USER_ERRORS):
            liveness.await_verdict()  # a collective that failed for a lost node: that ends here, with 75
        liveness.stop()
        stuck = stuck_ranks.explain(error, config.distributed.timeout_s)
        if stuck is not None:  # a rank that never entered the collective: named, with every rank's stacks
            report_error(stuck)
            return 1
        return report(error)
    liveness.stop()
    tell_launcher(FINISHED)
    return 0


def report(error: Exception) -> int:
    """A user error's line or a bug's traceback, to the launcher or the terminal; the exit code."""
    message = str(error) if isinstance(error, USER_ERRORS) else os_error_message(error)
    if message is not None:
        report_error(f"error: {message}")
    elif not report_crash(error):
        raise error
    return 1


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
