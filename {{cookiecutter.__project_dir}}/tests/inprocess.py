"""Training in the test process itself (world size 1, no torchrun): the fast tier's way to run the loop."""

from __future__ import annotations

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.launch.preemption import (
    PreemptionWatch,
)
from {{ cookiecutter.package_name }}.loop.trainer import (
    Trainer,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    TASK,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    distributed,
)


def fit(overrides: list[str], preemption: PreemptionWatch | None = None) -> dict[str, float]:
    config = load_config(overrides)
    with distributed(config.distributed) as env:
        return Trainer(config, TASK, env, preemption).fit()


class StopAfter(PreemptionWatch):
    """A preemption that every rank agrees on after ``steps`` optimizer steps, as a signal would be."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps_left = steps

    def agreed(self, checkpoint_due: bool = False) -> bool:
        self.checkpoint_due = checkpoint_due  # one process: its vote is the agreement
        self.steps_left -= 1
        if self.steps_left == 0:
            self.received = "SIGTERM"
            return True
        return False
