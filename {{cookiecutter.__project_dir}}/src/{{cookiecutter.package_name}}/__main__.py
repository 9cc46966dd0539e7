"""Entry point: ``python -m <package> [key=value ...]``, one process, or many under ``torchrun``.

Configuration and data paths are checked before any process group exists, so a mistake ends the job
in seconds with one line naming the key, instead of after a rendezvous. torch and the model type's
libraries are imported only after the checks, which keeps ``--check`` fast.
"""

from __future__ import annotations

import os
import sys

# One OpenMP thread per process, as launch.sh starts it, set before torch loads (see launch.sh).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from .config import ConfigError, load_config
from .launch.errors import report_error
from .launch.lifeline import exit_at_once, expected_parent, tie_to_parent
from .launch.preflight import check
from .parallel.environment import launched_by_torchrun

USAGE = """usage: python -m {package} [key=value ...]

Trains with the defaults in {package}/config/defaults.yaml, each key=value overriding one of them,
e.g. train.lr=1e-4 data.batch_size=8 output_dir=outputs/run2. Run under torchrun (see launch.sh)
for more than one process. Exit codes: 0 finished, 75 stopped after a checkpoint (SIGTERM, SIGUSR1,
Ctrl-C; the same command resumes), 1 an error.

  --check   validate the configuration, paths, model and output_dir, then exit (0 when the run can start)"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in args):
        print(USAGE.format(package=__package__))
        return 0
    worker = launched_by_torchrun() and "--check" not in args
    if worker:  # before the slow imports: a torchrun killed meanwhile takes this process with it
        tie_to_parent(expected_parent())
    try:
        config = load_config([arg for arg in args if arg != "--check"])
        check(config, before_launch=not worker)
    except ConfigError as error:
        report_error(f"error: {error}")
        return 1
    if "--check" in args:
        return 0
    from .run import run

    return run(config) or 0  # torchrun's @record types the result as optional


if __name__ == "__main__":
    code = main()
    if launched_by_torchrun():
        exit_at_once(code)
    sys.exit(code)
