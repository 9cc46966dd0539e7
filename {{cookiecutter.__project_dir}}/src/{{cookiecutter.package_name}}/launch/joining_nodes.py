"""A node that joins a running elastic job (``NNODES=MIN:MAX``) is taken in, as torchrun promises.

When the nodes of a job come up more than torchrun's last call (30 s) apart, the first ones start with
what they have, and a later one joins while they train: torchrun stops the workers (SIGTERM, which they
take as a stop: they agree on a step, save a checkpoint and exit), forms the job again with the newcomer
and starts the workers, which resume from that checkpoint. Three things in the way, fixed here:

- torchrun (2.4 and later) has the rendezvous host publish the workers' master address once, in its first
  round; the newcomer waits for it in the round it joins and fails after 60 s (``DistStoreError: wait
  timeout ... MASTER_ADDR``), leaving the others waiting for it. Here the host publishes its address in
  every round and every other node reads the current one.
- torchrun names the workers' keys in its store, which lasts the whole job, by nothing that changes from
  round to round. The workers prefix them with a name the host draws for each round and every node reads
  (parallel/process_group.py), so a started worker never reads what a stopped one published.
- The stopped workers report a stop, which the launcher would end the node on (exit 75). Those reports
  are dropped before the workers start again: the stop was torchrun's, not the user's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..parallel.environment import WORKER_ROUND_ENV
from .status import PREEMPTED, outcome_path, read_outcomes

WORKER_ROUND_KEY = "launch.worker_round"


def take_in_joining_nodes(status: Path, say: Callable[[str], None]) -> None:
    """Patch torchrun's rendezvous and agent in this process (the launcher's); call once torch is imported."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    # torchrun runs in this process: its classes are patched, not subclassed, as it builds them itself.
    handler.next_rendezvous = _same_master_every_round(handler.next_rendezvous, RendezvousStoreInfo)  # type: ignore[method-assign]

    restart, initialize = SimpleElasticAgent._restart_workers, SimpleElasticAgent._initialize_workers
    joined: list[bool] = []  # set while torchrun restarts healthy workers for nodes that wait to join

    @functools.wraps(restart)
    def restart_workers(agent: Any, worker_group: Any) -> None:
        if worker_group.state == WorkerState.HEALTHY:  # torchrun restarts healthy workers only for this
            say(
                "launch.sh: a node joined this elastic job; the workers stop after a checkpoint and go on "
                "from it with every node"
            )
            joined.append(True)
        try:
            restart(agent, worker_group)
        finally:
            joined.clear()

    @functools.wraps(initialize)
    def initialize_workers(agent: Any, worker_group: Any) -> None:
        if joined:  # the stopped workers have exited: their reports of a stop were torchrun's stop
            forget_stops(status)
        initialize(agent, worker_group)

    SimpleElasticAgent._restart_workers = restart_workers  # type: ignore[method-assign]
    SimpleElasticAgent._initialize_workers = initialize_workers  # type: ignore[method-assign]


def _same_master_every_round(next_rendezvous: Callable, store_info: Any) -> Callable:
    @functools.wraps(next_rendezvous)
    def every_round(handler: Any) -> Any:
        info = next_rendezvous(handler)
        name_the_workers_round(info.store, info.rank)
        bootstrap = getattr(info, "bootstrap_store_info", None)
        if bootstrap is None:  # a torch older than 2.4: the workers' master comes from the round itself
            return info
        store = info.store
        if info.rank == 0:
            store.set(store_info.MASTER_ADDR_KEY, bootstrap.master_addr.encode("utf-8"))
            store.set(store_info.MASTER_PORT_KEY, str(bootstrap.master_port).encode("utf-8"))
        else:  # the host of this round, which may not be the host of the round this node cached
            address = store.get(store_info.MASTER_ADDR_KEY).decode("utf-8")
            port = int(store.get(store_info.MASTER_PORT_KEY).decode("utf-8"))
            info = type(info)(store, info.rank, info.world_size, store_info(address, port))
        return info

    return every_round


def name_the_workers_round(round_store: Any, rank: int) -> None:
    """The round's name, drawn by its host and read by every other node from the store of this round alone
    (torchrun prefixes it with the round), for the workers this node starts next."""
    if rank == 0:
        round_store.set(WORKER_ROUND_KEY, secrets.token_hex(8).encode("ascii"))
    os.environ[WORKER_ROUND_ENV] = f"round-{round_store.get(WORKER_ROUND_KEY).decode('ascii')}"


def forget_stops(status: Path) -> None:
    for outcome in read_outcomes(status):
        if outcome.kind == PREEMPTED:
            with contextlib.suppress(FileNotFoundError):
                outcome_path(status, outcome.attempt, outcome.rank).unlink()
