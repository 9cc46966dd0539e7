"""A single-node launch skips torchrun's random pause before the first rendezvous (launch/single_node.py)."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous, utils

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.launch.single_node import (
    skip_the_first_rendezvous_jitter,
)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """torchrun's pauses, recorded instead of slept; its rendezvous module is restored after the test."""
    slept: list[float] = []
    monkeypatch.setattr(utils.time, "sleep", slept.append)
    monkeypatch.setattr(dynamic_rendezvous, "_delay", dynamic_rendezvous._delay)
    return slept


def test_torchrun_pauses_a_random_while_before_a_nodes_first_rendezvous(sleeps: list[float]) -> None:
    """What is skipped: the call torchrun makes before a node's first round (the sleep is drawn in 0-0.3 s,
    so a few draws make one of at least 10 ms, the shortest it sleeps)."""
    for _ in range(20):
        dynamic_rendezvous._delay(seconds=(0, 0.3))
    assert sleeps and all(0.01 <= seconds <= 0.3 for seconds in sleeps)


def test_a_single_node_skips_the_random_pause_and_keeps_the_fixed_ones(sleeps: list[float]) -> None:
    skip_the_first_rendezvous_jitter()
    for _ in range(20):
        dynamic_rendezvous._delay(seconds=(0, 0.3))
    assert sleeps == []
    dynamic_rendezvous._delay(seconds=1)  # torchrun's pause before retrying a round
    assert sleeps == [1]
