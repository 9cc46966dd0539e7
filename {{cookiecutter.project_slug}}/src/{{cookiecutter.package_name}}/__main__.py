"""Entry point: ``python -m <package> [key=value ...]``, one process, or many under ``torchrun``.

Configuration and data paths are checked before any process group exists, so a mistake ends the job
in seconds with one line naming the key, instead of after a rendezvous.
"""

from __future__ import annotations

import sys

from .checkpoint import CheckpointError
from .config import ConfigError, load_config
from .data import DataError
from .distributed import distributed
from .metrics import setup_logging
from .tasks import load_task
from .trainer import Trainer

USAGE = """usage: python -m {package} [key=value ...]

Trains with the defaults in {package}/defaults.yaml, each key=value overriding one of them,
e.g. train.lr=1e-4 data.batch_size=8 output_dir=outputs/run2. Run under torchrun (see launch.sh)
for more than one process.

  --check   validate the configuration and data paths, then exit (0 when the run can start)"""


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
        if check_only:
            return 0
        with distributed(config.distributed) as env:
            setup_logging(env)
            Trainer(config, task, env).fit()
    except (ConfigError, DataError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
