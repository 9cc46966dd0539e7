"""One run at a time per output_dir: a lock that global rank 0 takes before it writes anything.

The lock is the file ``output_dir/.lock``, created with ``O_CREAT | O_EXCL`` and holding who took it:
host, pid, start time and torchrun's run id. While the run lives, a thread of rank 0 touches it every
HEARTBEAT_S seconds. Not ``fcntl``/``flock``: on NFSv3 they need a lock daemon, on Lustre a mount option,
some FUSE file systems lack them, and where they are missing they fail or, worse, succeed without
locking. An exclusive create and a file's mtime work wherever checkpoints can be written, and every node
of a job sees them on the shared storage.

A lock is abandoned, and the next run takes it over, when its holder
- ran on this machine (same host name, boot and pid namespace) and is gone: its pid is dead or belongs
  to a later process. Decided at once, e.g. right after a ``kill -9``;
- is the same job: the same torchrun run id, whose previous worker group torchrun ended before it started
  this one (an elastic restart, a node of a multi-node job coming back);
- ran elsewhere and its heartbeat stopped: watched for 2 x HEARTBEAT_S without moving while its mtime is
  over STALE_S old, or watched for STALE_S without moving, whatever the two machines' clocks say.
A live holder elsewhere shows its heartbeat within HEARTBEAT_S, so a second run is refused in seconds.
Reads open the file, which makes an NFS client revalidate the cached mtime.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import ConfigError

LOCK_NAME = ".lock"
HEARTBEAT_S = 5.0
STALE_S = 30.0
POLL_S = 0.25
# The pre-check only refuses a holder it sees alive; one it cannot judge yet is left to rank 0's lock.
PRECHECK_PATIENCE_S = 2 * HEARTBEAT_S + 1
# The run id that the pre-check of one node of a multi-node job shares with the job (launch.sh sets it).
LAUNCH_RUN_ID_ENV = "LAUNCH_RUN_ID"

log = logging.getLogger(__package__)


class OutputDirBusy(ConfigError):
    """Another run holds the output_dir."""


@dataclass(frozen=True)
class Holder:
    host: str = "?"
    machine: str = ""  # boot id and pid namespace: pids compare only where both match
    pid: int = 0
    started: str = ""  # the process's start time in /proc: tells a reused pid from its holder
    since: str = "?"
    run_id: str = ""
    token: str = ""


def this_machine() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:  # not Linux: holders here are judged by their heartbeat, as remote ones
        return ""


def process_start(pid: int) -> str:
    """When the process started (clock ticks after boot); empty for one that is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return ""
    return "" if fields[0] in ("Z", "X") else fields[19]  # the state, and field 22 of /proc/<pid>/stat


def is_running(holder: Holder) -> bool:
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        pass
    return bool(holder.started) and process_start(holder.pid) == holder.started


def read_holder(path: Path) -> tuple[Holder, float] | None:
    """The holder and the file's mtime; None when there is no lock."""
    try:
        with open(path, "rb") as handle:
            mtime = os.fstat(handle.fileno()).st_mtime
            content = handle.read()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(content)
        return Holder(**{key: fields[key] for key in Holder.__dataclass_fields__ if key in fields}), mtime
    except (ValueError, TypeError):  # a holder killed between creating and writing it
        return Holder(), mtime


def live_holder(path: Path, run_id: str, patience_s: float) -> Holder | None:
    """The live holder of the lock, watching its heartbeat for up to ``patience_s``; None when the lock is
    free, abandoned, ours (``run_id``), or not seen alive within ``patience_s``."""
    found = read_holder(path)
    if found is None:
        return None
    holder, mtime = found
    if run_id and holder.run_id == run_id:
        return None
    if holder.machine and holder.machine == this_machine():
        return holder if is_running(holder) else None
    started = time.monotonic()
    while True:
        watched = time.monotonic() - started
        if watched >= patience_s or (watched >= 2 * HEARTBEAT_S and time.time() - mtime > STALE_S):
            return None
        time.sleep(POLL_S)
        now = read_holder(path)
        if now is None:
            return None
        if now != (holder, mtime):  # a heartbeat, or a new holder: alive
            return now[0]


def busy_message(output_dir: Path, holder: Holder) -> str:
    return (
        f"output_dir={output_dir} is in use by another run (host {holder.host}, pid {holder.pid}, since "
        f"{holder.since}); wait for it to end, or choose another output_dir"
    )


def refuse_if_in_use(output_dir: Path) -> None:
    """The pre-check (launch.sh's launcher, or --check): refuse an output_dir that a live run holds, before
    torchrun starts."""
    holder = live_holder(output_dir / LOCK_NAME, os.environ.get(LAUNCH_RUN_ID_ENV, ""), PRECHECK_PATIENCE_S)
    if holder is not None:
        raise OutputDirBusy(busy_message(output_dir, holder))


class OutputDirLock:
    def __init__(self, output_dir: Path, run_id: str = "") -> None:
        self.output_dir = output_dir
        self.path = output_dir / LOCK_NAME
        self.me = Holder(
            host=socket.gethostname(),
            machine=this_machine(),
            pid=os.getpid(),
            started=process_start(os.getpid()),
            since=time.strftime("%Y-%m-%d %H:%M:%S"),
            run_id=run_id,
            token=uuid.uuid4().hex,
        )
        self.stopped = threading.Event()
        self.heartbeat = threading.Thread(target=self._beat, name="output_dir-lock", daemon=True)

    def acquire(self) -> None:
        """Take the lock, waiting up to STALE_S to judge a holder elsewhere; raise OutputDirBusy."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # each try either takes the lock or clears an abandoned one
            if self._create():
                self.heartbeat.start()
                return
            found = read_holder(self.path)
            holder = live_holder(self.path, self.me.run_id, STALE_S)
            if holder is not None:
                raise OutputDirBusy(busy_message(self.output_dir, holder))
            if found is not None:
                self._clear(found[0])
        raise OutputDirBusy(f"output_dir={self.output_dir}: other runs keep taking {self.path}; start one")

    def release(self) -> None:
        self.stopped.set()
        if self.heartbeat.is_alive():
            self.heartbeat.join()
        found = read_holder(self.path)
        if found is not None and found[0].token == self.me.token:
            self.path.unlink(missing_ok=True)

    def _create(self) -> bool:
        try:
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(asdict(self.me), handle)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _clear(self, abandoned: Holder) -> None:
        """Move the abandoned lock aside (rename is atomic) and delete it. Two runs may both judge it
        abandoned: if the file one of them moves is already the other's new lock, it goes back."""
        aside = self.path.with_name(f"{LOCK_NAME}.abandoned-{self.me.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = read_holder(aside)
        if moved is not None and moved[0].token != abandoned.token:
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        aside.unlink(missing_ok=True)

    def _beat(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            found = read_holder(self.path)
            try:
                if found is None or found[0].token != self.me.token:
                    raise FileNotFoundError(self.path)
                os.utime(self.path)
            except OSError:
                log.warning(f"{self.path} was taken over by another run; this run no longer holds it")
                return
