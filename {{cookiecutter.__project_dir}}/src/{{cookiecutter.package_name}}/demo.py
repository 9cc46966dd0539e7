"""Offline demo: ``python -m <package>.demo [directory]`` builds a tiny local checkpoint and demo data.

Nothing is downloaded. The checkpoint is saved with ``save_pretrained`` and loaded by training through
the same ``from_pretrained`` path a hub id takes. The overrides that point a run at it are written to
``<directory>/overrides.txt``, for ``NPROC_PER_NODE=2 ./launch.sh $(cat demo/overrides.txt)``. A GPU
project built where there is no CUDA gets overrides that train on the CPU, so the quickstart runs as
printed on a laptop too.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .config import Config, Device, Precision, load_config
from .config.cli import command_parser
from .config.constants import GPUS_PER_NODE

DESCRIPTION = """Builds a tiny local checkpoint of this project's model type and demo data in DIRECTORY
(default: demo), offline, and writes the overrides that train on them to DIRECTORY/overrides.txt
(on a machine without CUDA, a GPU project's overrides also switch training to CPU and gloo)."""

# The processes the quickstart starts on the demo: one per GPU of a GPU project, 2 on a CPU project.
DEMO_PROCESSES = GPUS_PER_NODE or 2


def cpu_overrides(config: Config, cuda_available: bool) -> list[str]:
    """What a run of ``config`` needs to train where there is no CUDA: the CPU, gloo, no fp16."""
    if cuda_available or config.distributed.device is Device.cpu:
        return []
    overrides = ["distributed.device=cpu", "distributed.backend=gloo"]
    if config.train.precision is Precision.fp16:  # its gradient scaler needs CUDA
        overrides.append("train.precision=fp32")
    return overrides


def launch_command(directory: Path) -> str:
    return f"NPROC_PER_NODE={DEMO_PROCESSES} ./launch.sh $(cat {directory / 'overrides.txt'})"


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("demo", DESCRIPTION)
    parser.add_argument(
        "directory", nargs="?", default="demo", type=Path, help="where to build (default: demo)"
    )
    directory: Path = parser.parse_args(argv).directory
    import torch  # and the model libraries below: only once the arguments are fine

    from .model_type.demo import build

    on_cpu = cpu_overrides(load_config([]), torch.cuda.is_available())
    overrides = [*on_cpu, *build(directory)]
    (directory / "overrides.txt").write_text(" ".join(overrides) + "\n", encoding="utf-8")
    print(f"demo checkpoint and data written to {directory}/")
    if on_cpu:
        print(f"no CUDA here: the overrides train on the CPU ({' '.join(on_cpu)})")
    processes = "1 process" if DEMO_PROCESSES == 1 else f"{DEMO_PROCESSES} processes"
    print(f"train on them with {processes}:\n  {launch_command(directory)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
