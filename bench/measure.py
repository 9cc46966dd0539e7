"""Running one training job and measuring it from outside: wall time, and the peak RSS of each rank.

Every runner is a torchrun job of 2 processes; the bench finds its ranks among the processes that carry
this job's BENCH_JOB id in their environment, and reads each one's peak resident set (VmHWM) until it
exits. Nothing is added to the code under test.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

POLL_S = 0.1  # two small reads per poll once the ranks are known


@dataclass
class Job:
    returncode: int
    launched: float  # Unix time just before the launch
    wall_s: float  # launch to exit
    peak_rss_mb: dict[int, float] = field(default_factory=dict)  # rank -> MiB
    stderr_tail: str = ""


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def find_ranks(root: int, job_id: str, known: dict[int, int]) -> None:
    """Add the job's rank processes under ``root`` to ``known`` (pid -> rank): the first processes down
    the tree with this job's id and a RANK (their DataLoader workers inherit both, and are not ranks)."""
    pending = _children(root)
    while pending:
        pid = pending.pop()
        if pid in known:
            continue
        env = _environment(pid)
        if env.get("BENCH_JOB") == job_id and "RANK" in env:
            known[pid] = int(env["RANK"])
        else:
            pending += _children(pid)


def run_job(
    command: list[str], env: dict[str, str], cwd: Path, log: Path, timeout_s: float, world_size: int
) -> Job:
    job_id = uuid.uuid4().hex
    env = {**env, "BENCH_JOB": job_id}
    ranks: dict[int, int] = {}
    peaks: dict[int, float] = {}
    with log.open("w") as output:
        launched = time.time()
        started = time.perf_counter()
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if time.perf_counter() - started > timeout_s:
                process.kill()
                break
            if len(ranks) < world_size:
                find_ranks(process.pid, job_id, ranks)
            for pid, rank in ranks.items():
                peak = peak_rss_mb(pid)
                if peak is not None:
                    peaks[rank] = max(peaks.get(rank, 0.0), peak)
            time.sleep(POLL_S)
        returncode = process.wait()
        wall_s = time.perf_counter() - started
    tail = log.read_text(errors="replace")[-3000:]
    return Job(returncode, launched, wall_s, peaks, tail)
