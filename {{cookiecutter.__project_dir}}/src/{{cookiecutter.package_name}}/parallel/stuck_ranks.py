"""A rank alive but stuck: when a collective times out, name the rank that did not arrive, and keep every
rank's Python stacks in output_dir/logs/.

A collective that one rank never enters (a deadlock outside collectives, an endless loop, a collective
called in a rank-0-only branch) ends after ``distributed.timeout_s``, and only on the ranks that entered
it, with gloo's "Timed out waiting 1800000ms for recv operation", which names no one. So every rank runs
a thread that, once asked through the job's store, writes the stacks of all its threads and publishes
where its main thread is: inside a collective (which one, called from where) or not. The first rank
whose collective timed out asks, waits up to ``ANSWER_S`` for the answers and publishes one line; every
rank that failed, and every rank that answered, reports that same line, so each launcher shows it once.
The thread needs the GIL, which a rank blocked on a lock, in a collective or in a Python loop gives up
now and then; a rank that does not answer at all is named as such.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

ANSWER_S = 10.0  # how long the asking rank waits for the others' answers
POLL_S = 1.0  # how often each rank's thread looks for a request
# gloo's words for it: "Timed out waiting 10000ms for recv operation", "Application timeout caused pair
# closure" (a pair torn down mid-backward), a work's "Wait timeout".
TIMED_OUT = re.compile(r"timed out|\btimeout\b", re.IGNORECASE)
_TORCH = str(Path(torch.__file__).parent) + os.sep
_COLLECTIVES = _TORCH + "distributed" + os.sep
_AUTOGRAD = _TORCH + "autograd" + os.sep
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"])) + os.sep
_PROJECT_COLLECTIVES = str(Path(__file__).with_name("process_group.py"))
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # src/ (or site-packages/)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Where:
    """Where a rank's main thread was when it was asked (or, for a rank that timed out, when it did)."""

    rank: int
    host: str
    location: str  # the innermost frame of the user's or the project's code: "loop/trainer.py:254 in f"
    collective: str | None  # the collective it waits in, None when it is in none

    def describe(self) -> str:
        if self.collective is None:
            return f"outside any collective, at {self.location}"
        return f"in {self.collective}, called at {self.location}"


def collective_timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a collective's timeout (gloo's, or a work's wait), not any other failure."""
    return isinstance(error, RuntimeError) and bool(TIMED_OUT.search(str(error)))


def where(frames: traceback.StackSummary, rank: int) -> Where:
    own = [index for index, frame in enumerate(frames) if not _plumbing(frame.filename)]
    innermost = own[-1] if own else len(frames) - 1
    # Only what the innermost own frame called counts: torch's frames further out (torchrun's @record
    # around main) wrap the whole run.
    collective = None
    for frame in reversed(frames[innermost + 1 :]):
        if frame.filename.startswith(_COLLECTIVES) or frame.filename == _PROJECT_COLLECTIVES:
            collective = frame.name
            break
        if frame.filename.startswith(_AUTOGRAD):
            collective = "backward (the gradients' all-reduce)"
            break
    caller = frames[innermost]
    location = f"{_short(caller.filename)}:{caller.lineno} in {caller.name}"
    return Where(rank, socket.gethostname(), location, collective)


def _plumbing(filename: str) -> bool:
    """torch, Python's own library (not the packages installed beside it) and the collectives' helpers:
    the frames that say how a rank waits, not which code of the user's or the project's asked it to."""
    if filename.startswith(_STDLIB) and not re.search(r"[/\\](site|dist)-packages[/\\]", filename):
        return True
    return filename.startswith((_TORCH, _PROJECT_COLLECTIVES, str(Path(__file__))))


def _short(filename: str) -> str:
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(_PACKAGE_ROOT / __package__.split(".")[0]))
    except ValueError:
        return str(Path(*path.parts[-2:]))


def all_stacks(main_frames: str | None = None) -> str:
    """Every thread's Python stack; ``main_frames`` stands in for the main thread's (a caught error's)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = main_frames if ident == main and main_frames else "".join(traceback.format_stack(frame))
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident}):\n{stack}')
    return "\n".join(parts)


class Watch:
    """This rank's side: answer a request with its stacks and where it is."""

    def __init__(self, rank: int, world_size: int, logs: Path, tell: Callable[[str], bool]) -> None:
        self.rank, self.world_size, self.logs, self.tell = rank, world_size, logs, tell
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        client = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=30))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = dist.PrefixStore(f"stuck-ranks-{attempt}", client)
        # Set by the main thread once its collective timed out: it answers itself, from the error's
        # traceback, as its current frames are the error handler's.
        self.timed_out = threading.Event()

    def run(self) -> None:
        try:
            while not self.store.check(["request"]):
                time.sleep(POLL_S)
            if self.timed_out.is_set():
                return
            main = sys._current_frames().get(threading.main_thread().ident or 0)
            frames = traceback.extract_stack(main) if main is not None else traceback.StackSummary()
            self.answer(where(frames, self.rank), all_stacks())
            verdict = self.await_verdict()
            if verdict is not None:  # the job is over; a rank that never returns would hold its node
                self.tell(verdict)  # this node's launcher shows the line even where no rank here failed
                os._exit(1)
        except Exception as error:  # the watch must never be what fails a run
            log.debug(f"the watch for stuck ranks stopped: {error!r}")

    def answer(self, here: Where, stacks: str) -> None:
        store = self.store
        stamp = store.get("request").decode().split()[1]
        path = self.logs / f"stacks-{stamp}-rank{self.rank}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"rank {self.rank} on {here.host}, {here.describe()}\n\n{stacks}", encoding="utf-8")
        store.set(f"where/{self.rank}", json.dumps(asdict(here)))

    def await_verdict(self, within_s: float = ANSWER_S + 5) -> str | None:
        store, deadline = self.store, time.monotonic() + within_s
        while time.monotonic() < deadline:
            if store.check(["verdict"]):
                verdict = store.get("verdict").decode()
                store.add("verdict-read", 1)
                return verdict
            time.sleep(POLL_S / 4)
        return None

    def explain(self, error: BaseException, timeout_s: float) -> str:
        """After this rank's collective timed out: ask every rank, and the one line to report."""
        store = self.store
        stamp = time.strftime("%Y%m%d-%H%M%S")
        asked = store.compare_set("request", "", f"{self.rank} {stamp}").decode()
        first = asked.split()[0] == str(self.rank)
        here = where(traceback.extract_tb(error.__traceback__), self.rank)
        if here.collective is None:  # its collective timed out, wherever torch raised the error
            here = replace(here, collective="a collective")
        self.answer(here, all_stacks("".join(traceback.format_exception(error))))
        if not first:
            verdict = self.await_verdict()
            if verdict:
                return verdict
        answers = self.gather()
        verdict = compose(answers, self.world_size, timeout_s, self.logs / f"stacks-{stamp}-rank*.txt")
        if first:
            store.set("verdict", verdict)
            # The store may live on this rank's node: it stays up until the others have read the line.
            deadline, others = time.monotonic() + ANSWER_S, len(answers) - 1
            while store.add("verdict-read", 0) < others and time.monotonic() < deadline:
                time.sleep(POLL_S / 4)
        return verdict

    def gather(self) -> dict[int, Where]:
        store, deadline = self.store, time.monotonic() + ANSWER_S
        keys = [f"where/{rank}" for rank in range(self.world_size)]
        while time.monotonic() < deadline and not store.check(keys):
            time.sleep(POLL_S / 4)
        answered = [rank for rank, key in enumerate(keys) if store.check([key])]
        return {rank: Where(**json.loads(store.get(keys[rank]))) for rank in answered}


def compose(answers: dict[int, Where], world_size: int, timeout_s: float, stacks: Path) -> str:
    """One line: the ranks that never entered the collective (outside any, or silent), and where the
    others waited; where every rank waited, how their collectives differ."""
    outside = [answer for answer in answers.values() if answer.collective is None]
    silent = [rank for rank in range(world_size) if rank not in answers]
    inside: dict[str, list[int]] = {}
    for answer in sorted(answers.values(), key=lambda answer: answer.rank):
        if answer.collective is not None:
            inside.setdefault(answer.describe(), []).append(answer.rank)
    parts = [f"rank {a.rank} ({a.host}) never entered it: it is {a.describe()}" for a in outside]
    parts += [f"rank {rank} never answered (stuck without releasing the GIL, or gone)" for rank in silent]
    if not parts:
        parts.append(
            "the ranks wait in different collectives"
            if len(inside) > 1
            else "every rank entered it, and the messages between them never arrived (the network)"
        )
    parts += [f"{_ranks(ranks)} waited {place}" for place, ranks in inside.items()]
    head = f"error: a collective timed out after {timeout_s:g} s (distributed.timeout_s)"
    return f"{head}: {'; '.join(parts)}; every rank's Python stacks are in {stacks}"


def _ranks(ranks: list[int]) -> str:
    listed = ", ".join(str(rank) for rank in sorted(ranks))
    return f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}"


_watch: Watch | None = None


def start(output_dir: Path, tell: Callable[[str], bool]) -> None:
    """Answer requests from a thread of this rank, in a job of several processes under torchrun."""
    global _watch
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and "MASTER_ADDR" in os.environ:
        try:
            _watch = Watch(int(os.environ.get("RANK", "0")), world_size, output_dir / "logs", tell)
        except Exception as error:  # the watch must never be what fails a run
            log.warning(f"no watch for stuck ranks: {error!r}")
            return
        threading.Thread(target=_watch.run, name="stuck-ranks", daemon=True).start()


def timed_out(error: BaseException) -> None:
    """First thing after a collective failed: this rank answers for itself from now on."""
    if _watch is not None and collective_timed_out(error):
        _watch.timed_out.set()


def explain(error: BaseException, timeout_s: float) -> str | None:
    """The line for a collective's timeout, or None (another error, no watch, or the store failed)."""
    if _watch is None or not collective_timed_out(error):
        return None
    try:
        return _watch.explain(error, timeout_s)
    except Exception as failure:
        log.warning(f"the ranks could not be asked where they are: {failure!r}")
        return None
