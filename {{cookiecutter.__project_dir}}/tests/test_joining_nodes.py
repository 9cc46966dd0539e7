"""The fixes that let a node join a running elastic job (launch/joining_nodes.py), each on its own; the
join itself runs under torchrun in test_elastic.py."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.launch.joining_nodes import (
    _same_master_every_round,
    forget_stops,
    name_the_workers_round,
)
from {{ cookiecutter.package_name }}.launch.status import (
    CRASH,
    PREEMPTED,
    Outcome,
    outcome_path,
    read_outcomes,
)
from {{ cookiecutter.package_name }}.parallel import (
    process_group,
)
from {{ cookiecutter.package_name }}.parallel.environment import (
    WORKER_ROUND_ENV,
)


class Store(dict):
    def set(self, key: str, value: bytes) -> None:
        self[key] = value

    def get(self, key: str) -> bytes:
        return self[key]


def test_the_host_publishes_its_address_in_every_round_and_the_others_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(WORKER_ROUND_ENV, raising=False)  # restored after the test
    cached = RendezvousStoreInfo("node0", 29400)  # what torch built in the first round, then kept
    this_round = Store()
    host = _same_master_every_round(lambda _: RendezvousInfo(this_round, 0, 2, cached), RendezvousStoreInfo)
    assert host(None).bootstrap_store_info is cached
    assert {key: this_round[key] for key in ("MASTER_ADDR", "MASTER_PORT")} == {
        "MASTER_ADDR": b"node0",
        "MASTER_PORT": b"29400",
    }
    stale = RendezvousStoreInfo("an-old-host", 1)
    other = _same_master_every_round(lambda _: RendezvousInfo(this_round, 1, 2, stale), RendezvousStoreInfo)
    info = other(None)
    assert (info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port) == ("node0", 29400)
    assert (info.rank, info.world_size, info.store) == (1, 2, this_round)


def test_every_node_names_a_round_of_workers_alike_and_no_two_rounds_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workers' keys in torchrun's store, which lasts the job, are prefixed with the round's name: a
    worker started for a joining node must not read the address a stopped worker published (restart
    counts stay when torchrun takes in a node, and differ between nodes after one node's failure)."""
    monkeypatch.delenv(WORKER_ROUND_ENV, raising=False)
    names = []
    for _ in range(3):  # three rounds, each with a store of its own, as torchrun prefixes them
        this_round = Store()
        on_each_node = []
        for rank in (0, 1, 2):  # the host first: the others' get waits for its set in torchrun's store
            name_the_workers_round(this_round, rank)
            on_each_node.append(os.environ[WORKER_ROUND_ENV])
        assert len(set(on_each_node)) == 1
        names.append(on_each_node[0])
    assert len(set(names)) == 3


def test_workers_prefix_their_keys_with_the_round_torchrun_started_them_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = []
    monkeypatch.setattr(process_group.dist, "TCPStore", lambda *args, **kwargs: made.append(args) or Store())
    monkeypatch.setattr(process_group.dist, "PrefixStore", lambda prefix, store: (prefix, store))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv(WORKER_ROUND_ENV, "round-5e1f")
    arguments = process_group._store_for_this_round(1, 2, timedelta(seconds=5))
    assert arguments["store"][0] == "round-5e1f" and (arguments["rank"], arguments["world_size"]) == (1, 2)
    assert made == [("node0", 29400, 2)]
    monkeypatch.delenv(WORKER_ROUND_ENV)  # torchrun started without launch.sh: its restart count
    assert process_group._store_for_this_round(1, 2, timedelta(seconds=5))["store"][0] == "attempt-1"
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")  # another launcher: the default env:// rendezvous
    assert process_group._store_for_this_round(1, 2, timedelta(seconds=5)) == {}


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
