"""The two fixes that let a node join a running elastic job (launch/joining_nodes.py), each on its own; the
join itself runs under torchrun in test_elastic.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.launch.joining_nodes import (
    _same_master_every_round,
    forget_stops,
)
from {{ cookiecutter.package_name }}.launch.status import (
    CRASH,
    PREEMPTED,
    Outcome,
    outcome_path,
    read_outcomes,
)


class Store(dict):
    def set(self, key: str, value: bytes) -> None:
        self[key] = value

    def get(self, key: str) -> bytes:
        return self[key]


def test_the_host_publishes_its_address_in_every_round_and_the_others_read_it() -> None:
    cached = RendezvousStoreInfo("node0", 29400)  # what torch built in the first round, then kept
    this_round = Store()
    host = _same_master_every_round(lambda _: RendezvousInfo(this_round, 0, 2, cached), RendezvousStoreInfo)
    assert host(None).bootstrap_store_info is cached
    assert this_round == {"MASTER_ADDR": b"node0", "MASTER_PORT": b"29400"}
    stale = RendezvousStoreInfo("an-old-host", 1)
    other = _same_master_every_round(lambda _: RendezvousInfo(this_round, 1, 2, stale), RendezvousStoreInfo)
    info = other(None)
    assert (info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port) == ("node0", 29400)
    assert (info.rank, info.world_size, info.store) == (1, 2, this_round)


def test_only_the_stops_of_the_stopped_workers_are_forgotten(tmp_path: Path) -> None:
    outcomes = [
        Outcome(PREEMPTED, "stopped by SIGTERM after step 5; checkpoint saved", 0, 0, 11, 1.0),
        Outcome(PREEMPTED, "stopped by SIGTERM after step 5; checkpoint saved", 1, 0, 12, 1.0),
        Outcome(CRASH, "RuntimeError: an earlier attempt's", 1, 1, 13, 0.5),
    ]
    for outcome in outcomes:
        path = outcome_path(tmp_path, outcome.attempt, outcome.rank)
        path.write_text(json.dumps(dataclasses.asdict(outcome)))
    forget_stops(tmp_path)
    assert read_outcomes(tmp_path) == [outcomes[2]]
