"""Offline demo: ``python -m <package>.demo [directory]`` builds a tiny local checkpoint and demo data.

Nothing is downloaded. The checkpoint is saved with ``save_pretrained`` and loaded by training through
the same ``from_pretrained`` path a hub id takes. The overrides that point a run at it are printed and
written to ``<directory>/overrides.txt``, for ``./launch.sh $(cat demo/overrides.txt)``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .constants import MODEL_TYPE


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0] if args else "demo")
    builder = importlib.import_module(f"{__package__}.demos.{MODEL_TYPE.replace('-', '_')}")
    overrides = builder.build(directory)
    (directory / "overrides.txt").write_text(" ".join(overrides) + "\n", encoding="utf-8")
    print(f"demo checkpoint and data written to {directory}/")
    print(f"train on them with 2 processes:\n  NPROC_PER_NODE=2 ./launch.sh {' '.join(overrides)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
