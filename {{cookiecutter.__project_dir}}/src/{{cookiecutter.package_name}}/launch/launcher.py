"""torchrun for launch.sh, run in this process: the user sees the project's lines, never torchrun's report.

launch.sh runs ``python -m <package>.launcher <torchrun arguments>``: torchrun's own ``main`` with the same
arguments, and six differences.

- The pre-check. Before torch is imported, this process refuses a bad override, a missing path or model,
  or an output_dir that another run holds, in one line (launch/preflight.py): no process group is formed
  for a run that cannot start, and a launch starts one Python process fewer than a separate check would.

- The terminal. torchrun's log and its report of a failed worker (35-40 lines, more with restarts) go to a
  file. Once torchrun returns, every worker of this node has exited and left its outcome
  (launch/status.py); this prints each distinct user error's line once, or one line for a bug that names
  a log file under output_dir holding the tracebacks and torchrun's report.
- Signals. SIGTERM, SIGINT and SIGUSR1 are blocked here, in every thread (main() blocks them before
  torch, imported only then, starts threads of its own), so torchrun's handlers, which stop the workers,
  kill them 30 s later and exit 1, never run. One thread takes them and passes them on as a stop request,
  as launch.sh does; the workers act on it, save a checkpoint and exit, and torchrun sees a clean end.
  The workers inherit the block and lift it once their own handlers are in place: a signal that comes
  while they start waits.
- Addresses. In a multi-node job, torchrun and gloo get the address that routes to MASTER_ADDR, not the
  one the host name resolves to (launch/node_address.py).
- Lifetimes. This process dies with launch.sh, and the workers with this process (launch/lifeline.py).
- A single-node job skips torchrun's random pause before its first rendezvous, which spreads many nodes'
  first requests (launch/single_node.py).

The exit code is launch.sh's: 0 finished, 75 stopped after a checkpoint (on every node: each worker
reports the stop its group agreed on), 1 an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError, load_config
from ..config.constants import PACKAGE
from ..parallel.environment import LIVENESS_STATE_FILE, Verdict, read_verdict
from .joining_nodes import take_in_joining_nodes
from .lifeline import PARENT_PID_ENV, exit_at_once, tie_to_parent
from .node_address import NodeAddressError, with_node_address
from .preflight import check
from .single_node import skip_the_first_rendezvous_jitter
from .status import (
    CRASH,
    PREEMPTED,
    PREEMPTED_EXIT_CODE,
    STATUS_DIR_ENV,
    USER_ERROR,
    Outcome,
    read_outcomes,
    request_stop,
)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# After a lost node's verdict, the time torchrun has to return before this process ends on its own: its
# shutdown may wait on a rendezvous host that is gone.
LOST_NODE_GRACE_S = 5.0
concluded = threading.Lock()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    tie_to_parent()
    try:
        check(load_config(worker_overrides(args)), before_launch=True)
    except ConfigError as error:
        say(f"error: {error}")
        return 1
    try:
        args = with_node_address(args)
    except NodeAddressError as error:
        say(str(error))
        return 1
    status = Path(os.environ.get(STATUS_DIR_ENV) or tempfile.mkdtemp(prefix="launch-status-"))
    os.environ[STATUS_DIR_ENV] = str(status)
    os.environ[PARENT_PID_ENV] = str(os.getpid())
    threading.Thread(target=pass_stop_signals_on, args=(status,), name="stop-signals", daemon=True).start()
    from torch.distributed.run import main as torchrun

    take_in_joining_nodes(status, say)
    if "--standalone" in args:  # launch.sh's single-node job
        skip_the_first_rendezvous_jitter()
    torchrun_log = status / "torchrun.log"
    _log_to(torchrun_log)  # after importing torch, which sets up loggers of its own
    watch = threading.Thread(
        target=end_when_a_node_is_lost, args=(status, elastic_restarts(args)), name="lost-node", daemon=True
    )
    watch.start()
    failure = None
    try:
        torchrun(args)
    except Exception as error:  # a worker failed (ChildFailedError), the rendezvous failed, ...
        failure = error
        logging.getLogger(__name__).error(f"torchrun failed:\n{error}", exc_info=error)
    if lost_rendezvous_host(failure, status):
        failure = LostNode(lost_rendezvous_host_message(args))
    with concluded:
        return conclude(read_outcomes(status), failure, lambda: write_failure_log(args, status, torchrun_log))


def pass_stop_signals_on(status: Path) -> None:
    """A stop signal sent to the whole job (Ctrl-C, `kill -- -PGID`) reaches this process too, blocked:
    it asks the workers to stop as launch.sh's trap does, so the request does not rest on the shell alone.
    The template's CI once saw a Ctrl-C to the whole job, its workers paused, write no request within 60 s:
    bash runs a trap only when its `wait` notices the signal, and did not."""
    while True:
        number = signal.sigwait(STOP_SIGNALS)
        with contextlib.suppress(OSError):  # launch.sh has ended and removed the folder
            request_stop(status, signal.Signals(number).name)


class LostNode(Exception):
    """torchrun lost the rendezvous host while the workers trained."""


def lost_rendezvous_host(failure: Exception | None, status: Path) -> bool:
    """torchrun's own link to the rendezvous host broke after the nodes had formed the job (their watch of
    lost nodes had started): the host is gone, before the workers' own verdict came."""
    broken_link = type(failure).__name__ in ("RendezvousConnectionError", "DistStoreError")
    return broken_link and (status / LIVENESS_STATE_FILE).exists()


def lost_rendezvous_host_message(args: list[str]) -> str:
    from ..parallel.checkpoint import describe_newest  # imports torch: see main()

    endpoint = _option(args, "--rdzv-endpoint", "?")
    try:
        newest = describe_newest(Path(output_dir(args)) / "checkpoints")
    except ConfigError:
        newest = "the newest complete checkpoint is in output_dir"
    return (
        f"node 0 ({endpoint.rsplit(':', 1)[0]}) was lost: the rendezvous store on it stopped answering "
        f"(killed, frozen or cut off); {newest}; run the same command again on every node to resume"
    )


def end_when_a_node_is_lost(status: Path, restarts: int) -> None:
    """A lost node ends this node in a bounded time, whatever torchrun waits on (its workers die with
    this process). An elastic job with `restarts` left goes on instead: torchrun restarts the workers
    on the nodes left, unless the lost node held the rendezvous, which no restart can reach."""
    attempt = 0
    while True:
        verdict = _await_verdict(status, since_attempt=attempt)
        if verdict.attempt >= restarts or verdict.rendezvous_host:
            break
        say(
            f"launch.sh: {verdict.who} was lost; this elastic job goes on with the nodes left, from its "
            f"newest complete checkpoint (torchrun's restart {verdict.attempt + 1} of {restarts})"
        )
        attempt = verdict.attempt + 1
    time.sleep(LOST_NODE_GRACE_S)  # main() normally concludes in this time
    if concluded.acquire(blocking=False):
        say(f"launch.sh: {verdict.line}")
        os._exit(PREEMPTED_EXIT_CODE)


def _await_verdict(status: Path, since_attempt: int) -> Verdict:
    while (verdict := read_verdict(status)) is None or verdict.attempt < since_attempt:
        time.sleep(0.5)
    return verdict


def elastic_restarts(args: list[str]) -> int:
    """The restarts torchrun may spend going on with fewer nodes: its --max-restarts in an elastic job
    (--nnodes=MIN:MAX, MIN < MAX), none otherwise."""
    nnodes = _option(args, "--nnodes", "1")
    low, _, high = nnodes.partition(":")
    if not high or low == high:
        return 0
    return int(_option(args, "--max-restarts", "0"))


def _option(args: list[str], name: str, default: str) -> str:
    return next((arg.split("=", 1)[1] for arg in args if arg.startswith(f"{name}=")), default)


def conclude(outcomes: list[Outcome], failure: Exception | None, failure_log: Callable[[], Path]) -> int:
    """Print what the run's end means for the user and return launch.sh's exit code."""
    failed = getattr(failure, "failures", {})  # ChildFailedError: global rank -> ProcessFailure
    reported = [outcome for outcome in outcomes if outcome.pid in {p.pid for p in failed.values()}]
    attempt = reported[0].attempt if reported else max((o.attempt for o in outcomes), default=0)
    this_attempt = [outcome for outcome in outcomes if outcome.attempt == attempt]

    stops = [outcome for outcome in this_attempt if outcome.kind == PREEMPTED]
    if stops:  # the checkpoint is on disk, whatever happened after it
        say(f"launch.sh: {stops[0].message}")
        return PREEMPTED_EXIT_CODE
    if isinstance(failure, LostNode):
        say(f"launch.sh: {failure}")
        return PREEMPTED_EXIT_CODE
    if failure is None:
        return 0
    user_errors = [outcome.message for outcome in this_attempt if outcome.kind == USER_ERROR]
    if user_errors:
        for message in dict.fromkeys(user_errors):  # each once, in rank order
            say(message)
        return 1
    log_path = failure_log()
    reported_pids = {outcome.pid for outcome in reported}
    silent = [(rank, process) for rank, process in sorted(failed.items()) if process.pid not in reported_pids]
    # Each rank reports before it leaves the process group (run.py): the cause's report is the earliest.
    crashes = sorted((o for o in reported if o.kind == CRASH), key=lambda outcome: outcome.time)
    if silent:  # died without a word (a signal, a segfault): the cause; the others failed for lack of it
        rank, process = silent[0]
        how = f"exited with {process.exitcode}"
        if process.exitcode < 0:
            how = f"was killed by {process.signal_name()}"
        say(f"error: rank {rank} (pid {process.pid}) {how}; torchrun's report is in {log_path}")
    elif crashes:
        say(f"error: rank {crashes[0].rank} failed with {crashes[0].message}; the traceback is in {log_path}")
    else:
        first_line = (str(failure).strip().splitlines() or [""])[0]
        say(f"error: torchrun failed: {type(failure).__name__}: {first_line}; its report is in {log_path}")
    return 1


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_failure_log(args: list[str], status: Path, torchrun_log: Path) -> Path:
    """The workers' tracebacks and torchrun's log, in output_dir/logs (or the temp folder, failing that)."""
    crashes = [outcome for outcome in read_outcomes(status) if outcome.kind == CRASH]
    sections = [f"# {' '.join(args)}\n"]
    for crash in crashes:
        sections.append(f"\n## rank {crash.rank} (pid {crash.pid}, attempt {crash.attempt})\n{crash.detail}")
    if torchrun_log.exists():
        sections.append(f"\n## torchrun's log\n{torchrun_log.read_text(encoding='utf-8', errors='replace')}")
    name = f"failure-{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}.log"
    try:
        folder = Path(output_dir(args)) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text("".join(sections), encoding="utf-8")
    except (OSError, ConfigError):
        descriptor, raw = tempfile.mkstemp(prefix=f"{PACKAGE}-", suffix=f"-{name}")
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write("".join(sections))
        path = Path(raw)
    return path


def worker_overrides(args: list[str]) -> list[str]:
    """The run's key=value overrides: what follows ``-m <package>``."""
    return args[args.index("-m") + 2 :] if "-m" in args else []


def output_dir(args: list[str]) -> str:
    return load_config(worker_overrides(args)).output_dir


def _log_to(path: Path) -> None:
    """Every log record of this process into ``path``: the root logger's, and those of torch's loggers that
    write to stderr themselves."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        if isinstance(logger, logging.Logger) and (logger is loggers[0] or _to_stderr(logger)):
            logger.handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    logging.captureWarnings(True)


def _to_stderr(logger: logging.Logger) -> bool:
    return any(getattr(handler, "stream", None) is sys.stderr for handler in logger.handlers)


if __name__ == "__main__":
    exit_at_once(main())
