"""Whether torchrun started this process, and what a node's processes and its launcher leave each other in
launch.sh's status folder: read and written without importing torch."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


# A name for the workers' rendezvous round, the same on every node (launch/joining_nodes.py sets it per
# round): the prefix of the keys they publish in torchrun's store, which outlives the round.
WORKER_ROUND_ENV = "LAUNCH_WORKER_ROUND"


def restart_attempt() -> int:
    """torchrun's restart count: 0 for the first group of workers, 1 after the first restart, ..."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


# The watch of lost nodes has started (the job had formed), and what it last saw.
LIVENESS_STATE_FILE = "liveness"
# A lost node's verdict, one file per restart attempt: for every process of this node and its launcher
# (parallel/liveness.py writes it, launch/launcher.py reads it).
_VERDICT = re.compile(r"lost-(\d+)")


@dataclass(frozen=True)
class Verdict:
    line: str  # what the survivors say: who, since when, the newest checkpoint, what to do
    who: str  # "node 1 (host1)", or "the rendezvous host (...)"
    rendezvous_host: bool  # the lost node held the job's store: no restart can reach it
    attempt: int


def write_verdict(status: Path, verdict: Verdict) -> None:
    final = status / f"lost-{verdict.attempt}"
    partial = status / f".{final.name}.{os.getpid()}"
    partial.write_text(json.dumps(asdict(verdict)), encoding="utf-8")
    os.replace(partial, final)  # no reader sees half a verdict


def read_verdict(status: Path, attempt: int | None = None) -> Verdict | None:
    """The verdict of ``attempt``, or of the newest attempt that has one; None before any."""
    found = {int(m[1]): path for path in status.glob("lost-*") if (m := _VERDICT.fullmatch(path.name))}
    chosen = found.get(attempt) if attempt is not None else found.get(max(found, default=-1))
    if chosen is None:
        return None
    return Verdict(**json.loads(chosen.read_text(encoding="utf-8")))
