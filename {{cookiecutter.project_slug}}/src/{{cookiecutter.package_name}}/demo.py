"""Offline demo: ``python -m <package>.demo [directory]`` builds a tiny local checkpoint and demo data.

Nothing is downloaded. The checkpoint is saved with ``save_pretrained`` and loaded by training through
the same ``from_pretrained`` path a hub id takes. The overrides that point a run at it are printed and
written to ``<directory>/overrides.txt``, for ``./launch.sh $(cat demo/overrides.txt)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import command_parser

DESCRIPTION = """Builds a tiny local checkpoint of this project's model type and demo data in DIRECTORY
(default: demo), offline, and writes the overrides that train on them to DIRECTORY/overrides.txt."""


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("demo", DESCRIPTION)
    parser.add_argument(
        "directory", nargs="?", default="demo", type=Path, help="where to build (default: demo)"
    )
    directory: Path = parser.parse_args(argv).directory
    from .model_type.demo import build  # torch and the model libraries: only once the arguments are fine

    overrides = build(directory)
    (directory / "overrides.txt").write_text(" ".join(overrides) + "\n", encoding="utf-8")
    print(f"demo checkpoint and data written to {directory}/")
    print(f"train on them with 2 processes:\n  NPROC_PER_NODE=2 ./launch.sh {' '.join(overrides)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
