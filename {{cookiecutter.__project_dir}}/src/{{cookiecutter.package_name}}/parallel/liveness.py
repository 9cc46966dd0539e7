"""A lost node ends the job on every other node within ``distributed.node_timeout_s``, named, with exit 75.

A killed, frozen or cut-off node does not say goodbye: a collective with it waits for the process group's
timeout (30 minutes by default), or fails with gloo's "Connection closed by peer" that names no node. So
each node's first process bumps a counter of its node in the job's store (the rendezvous host's) from a
thread of its own, every tenth of the bound, and reads every node's counter. A node whose counter has not
moved for the bound, or a store that has not answered for that long (then the rendezvous host is the lost
one), is lost: the process leaves one line for its launcher (the node, its host, the newest complete
checkpoint) and ends at once with 75, whatever its main thread waits on; the other processes of its node
follow through a file in launch.sh's status folder. The counter moves while the process lives, whatever
its main thread does: slow preprocessing, a slow checkpoint write or a long evaluation is never taken for
a lost node. A frozen or cut-off node that comes back after the others ended writes nothing:
``ensure_not_cut_off()`` before every write of rank 0 ends it first.

A node that ends on purpose says so first (``stop()``: finished, stopped after a checkpoint, an error of
its own): its silence is then no loss, and the others report what happened to them as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from .environment import LIVENESS_STATE_FILE, Verdict, read_verdict, restart_attempt, write_verdict

EXIT_CODE = 75  # temporary: run the same command again (launch/preemption.py's PREEMPTED_EXIT_CODE)
log = logging.getLogger(__name__)


class Watch:
    """This process's view of the other nodes; started once the process group is up."""

    def __init__(self, timeout_s: float, describe_checkpoint: Callable[[], str], status: Path | None,
                 tell: Callable[[str], bool]) -> None:  # fmt: skip
        self.timeout_s, self.interval_s = timeout_s, max(timeout_s / 10, 0.2)
        self.describe_checkpoint, self.status, self.tell = describe_checkpoint, status, tell
        self.node, self.nodes = int(os.environ["GROUP_RANK"]), int(os.environ["GROUP_WORLD_SIZE"])
        self.beats = os.environ.get("LOCAL_RANK", "0") == "0"
        self.hosts: dict[int, str] = {}
        self.store_node: int | None = None
        self.confirmed = time.monotonic()  # the last round that saw every node alive
        self.moved = dict.fromkeys(range(self.nodes), time.monotonic())  # when each node's count last moved
        # A time each node has surely lived past: the round before the one that saw its count move. The
        # round that sees it move proves less: the beat it sees may predate the fault.
        self.alive_after = dict.fromkeys(range(self.nodes), 0.0)
        self.reached = time.monotonic()  # the last round the store answered
        self.ended = threading.Event()  # this node or another ended on purpose: nothing is lost
        self.store: dist.Store | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="liveness", daemon=True).start()

    def _run(self) -> None:
        try:
            if self.beats:
                threading.Thread(target=self._probe, name="liveness-probe", daemon=True).start()
                self._judge()
            else:
                self._follow()
        except Exception as error:  # the watch must never be what fails a run
            log.warning(f"the watch for lost nodes stopped: {error!r}")

    def _connect(self) -> dist.Store:
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        client = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
        store = dist.PrefixStore(f"liveness-{restart_attempt()}", client)
        store.set(f"host/{self.node}", socket.gethostname())
        if _is_local(address, port):
            store.set("store-node", str(self.node))
        return store

    def _probe(self) -> None:
        """Rounds with the store: beat, read every node's count. A round may hang for good (a store behind a
        cut link does not answer, and a client waits), so the judge, not this thread, decides."""
        counts = dict.fromkeys(range(self.nodes), -1)
        previous_round: float | None = None
        while not self.ended.is_set():
            try:
                if self.store is None:
                    self.store = self._connect()
                store = self.store
                store.add(f"beat/{self.node}", 1)
                now = time.monotonic()
                for node in range(self.nodes):
                    count = store.add(f"beat/{node}", 0)
                    if count != counts[node]:
                        counts[node], self.moved[node] = count, now
                        if previous_round is not None:
                            self.alive_after[node] = previous_round
                if store.add("ended", 0):
                    self.ended.set()
                    self._publish(ended=True)
                    return
                self._learn_names(store)
                self.reached = previous_round = now
            except Exception:  # the store failed to answer: the judge counts the silence
                pass
            time.sleep(self.interval_s)

    def _judge(self) -> None:
        last = time.monotonic()
        while not self.ended.is_set():
            now = time.monotonic()
            if now - last > self.timeout_s:  # this process did not run for that long: frozen, suspended
                self.end(self.cut_off_message(now - last))
            last = now
            stale = [
                node
                for node, moved in self.moved.items()
                if node != self.node and now - moved > self.timeout_s
            ]
            if now - self.reached > self.timeout_s:
                self.declare(self.store_node, f"the rendezvous host ({os.environ['MASTER_ADDR']})")
            elif stale:
                self.declare(stale[0], None)
            elif now - self.reached < 2 * self.interval_s:
                self.confirmed = now
                self._publish(ended=False)
            time.sleep(self.interval_s)

    def _publish(self, ended: bool) -> None:
        """What this node's other processes need to know when a collective fails under them."""
        if self.status is not None:
            partial = self.status / f".{LIVENESS_STATE_FILE}.{os.getpid()}"
            partial.write_text(f"{min(self.alive_after.values())} {int(ended)}", encoding="utf-8")
            os.replace(partial, self.status / LIVENESS_STATE_FILE)

    def _published(self) -> tuple[float, bool]:
        """The first process's view: when every node was last surely alive, and whether one ended."""
        if self.status is None:
            return 0.0, False
        try:
            alive_after, ended = (self.status / LIVENESS_STATE_FILE).read_text(encoding="utf-8").split()
            return float(alive_after), ended == "1"
        except (OSError, ValueError):
            return 0.0, False

    def _learn_names(self, store: dist.Store) -> None:
        if len(self.hosts) < self.nodes:
            for node in range(self.nodes):
                if node not in self.hosts and store.check([f"host/{node}"]):
                    self.hosts[node] = store.get(f"host/{node}").decode()
        if self.store_node is None and store.check(["store-node"]):
            self.store_node = int(store.get("store-node"))

    def _follow(self) -> None:
        """Another process of this node: end with the verdict of the node's first process."""
        while self.status is not None and not self.ended.is_set():
            verdict = read_verdict(self.status, restart_attempt())
            if verdict is not None:
                self.end(verdict.line)
            time.sleep(self.interval_s)

    def declare(self, node: int | None, fallback: str | None) -> None:
        who = f"node {node} ({self.hosts.get(node, 'host unknown')})" if node is not None else str(fallback)
        message = (
            f"{who} was lost: no sign of life for {self.timeout_s:g} s (killed, frozen or cut off); "
            f"{self.describe_checkpoint()}; run the same command again on every node to resume"
        )
        if self.status is not None:
            held_store = node is None or node == self.store_node
            write_verdict(self.status, Verdict(message, who, held_store, restart_attempt()))
        self.end(message)

    def end(self, message: str) -> None:
        if not self.tell(message):
            log.error(message)
        os._exit(EXIT_CODE)

    def stop(self) -> None:
        """This node ends on purpose: tell the others (best effort) and watch no more."""
        self.ended.set()
        if self.store is not None:  # in a thread of its own: a store behind a cut link never answers
            announce = threading.Thread(target=self._announce_end, args=(self.store,), daemon=True)
            announce.start()
            announce.join(timeout=self.interval_s)

    @staticmethod
    def _announce_end(store: dist.Store) -> None:
        with contextlib.suppress(Exception):  # a store that is gone has no one left to tell
            store.add("ended", 1)

    def wait_for_verdict(self, since: float) -> None:
        """Return once every node has surely lived past `since` (a collective that failed then did not fail
        for a lost node) or one ended on purpose; a lost node ends this process before."""
        deadline = since + self.timeout_s + 3 * self.interval_s
        while time.monotonic() < deadline and not self.ended.is_set():
            if self.beats and all(alive > since for alive in self.alive_after.values()):
                return
            alive_after, ended = self._published()
            if not self.beats and (alive_after > since or ended):
                return
            time.sleep(self.interval_s / 2)

    def ensure_not_cut_off(self) -> None:
        """Before a write: end here if this node has not seen every node alive for the bound (it was frozen
        or cut off, and the others have ended)."""
        silent = time.monotonic() - self.confirmed
        if self.beats and silent > self.timeout_s:
            self.end(self.cut_off_message(silent))

    def cut_off_message(self, silent: float) -> str:
        return (
            f"this node ({socket.gethostname()}, node {self.node}) was frozen or cut off for {silent:.0f} s, "
            "and the other nodes have ended; it writes nothing more; run the same command again on every "
            "node to resume"
        )


def _is_local(address: str, port: int) -> bool:
    """Whether the store at ``address`` runs on this machine: the route to it starts from the same address."""
    try:
        target = socket.getaddrinfo(address, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(target[0], socket.SOCK_DGRAM) as probe:
            probe.connect(target[4])
            return probe.getsockname()[0] == target[4][0]
    except OSError:
        return False


_watch: Watch | None = None


def start(
    timeout_s: float, describe_checkpoint: Callable[[], str], status: Path | None, tell: Callable[[str], bool]
) -> None:
    """Watch the other nodes, on a job of several nodes under torchrun (a lost process of this node is
    torchrun's to handle). `tell` leaves a verdict's line for the launcher (False: there is none)."""
    global _watch
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1 and "GROUP_RANK" in os.environ:
        _watch = Watch(timeout_s, describe_checkpoint, status, tell)
        _watch.start()


def ensure_not_cut_off() -> None:
    if _watch is not None:
        _watch.ensure_not_cut_off()


def stop() -> None:
    """This node's run ends on purpose (finished, stopped, an error of its own)."""
    if _watch is not None:
        _watch.stop()


def await_verdict() -> None:
    """After a collective failed: give the watch up to the bound to find a lost node (it then ends this
    process with 75); return at once when every node is alive or one ended on purpose, and the failure
    is reported as it is."""
    if _watch is not None:
        _watch.wait_for_verdict(since=time.monotonic())
