"""One training run in this process, under torchrun or alone, once the pre-flight checks have passed."""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import record

from .checkpoint import CheckpointError
from .config import Config, ConfigError
from .data import DataError
from .distributed import distributed, launched_by_torchrun
from .errors import report_error
from .log import log, setup_logging
from .model_type.task import TASK
from .preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionWatch
from .trainer import Trainer


@record  # under torchrun, an unexpected exception's traceback is reported once, as the root cause
def run(config: Config) -> int:
    try:
        preemption = PreemptionWatch()
        with distributed(config.distributed) as env:
            setup_logging(env, config.log_level)
            Trainer(config, TASK, env, preemption).fit()
    except (ConfigError, DataError, CheckpointError) as error:
        report_error(f"error: {error}")
        return 1
    except Preempted as stop:
        log.info(f"preempted: {stop}; run the same command again to resume")
        return 0 if launched_by_torchrun() else PREEMPTED_EXIT_CODE
    return 0
