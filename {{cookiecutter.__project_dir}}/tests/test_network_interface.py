"""gloo's network interface: it follows NCCL_SOCKET_IFNAME, and every process group is made on it."""

from __future__ import annotations

import os
import socket

import pytest
import torch.distributed as dist
from conftest import ON_THIS_MACHINE

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.parallel.process_group import (
    distributed,
    gloo_follows_nccl_interface,
)


@pytest.mark.parametrize(
    ("nccl", "interfaces", "gloo"),
    [
        ("eth1", ["lo", "eth0", "eth1"], "eth1"),
        ("eth", ["lo", "eth0", "eth1"], "eth0"),  # NCCL's prefix: gloo needs one exact name
        ("=ib0", ["lo", "ib0", "ib01"], "ib0"),
        ("ens5,eth0", ["lo", "eth0"], "eth0"),
        ("^docker,lo", ["lo", "eth0"], None),  # exclusions have no gloo form
        ("wlan", ["lo", "eth0"], None),
        ("", ["lo", "eth0"], None),
    ],
)
def test_gloo_follows_the_nccl_interface(nccl: str, interfaces: list[str], gloo: str | None) -> None:
    environ = {"NCCL_SOCKET_IFNAME": nccl}
    gloo_follows_nccl_interface(environ, interfaces)
    assert environ.get("GLOO_SOCKET_IFNAME") == gloo
    mine = {"NCCL_SOCKET_IFNAME": nccl, "GLOO_SOCKET_IFNAME": "bond0"}
    gloo_follows_nccl_interface(mine, interfaces)
    assert mine["GLOO_SOCKET_IFNAME"] == "bond0"  # set by the user: left alone


class Joined(Exception):
    """Stands in for the process group, once init_process_group was reached."""


def test_process_groups_are_made_with_gloo_on_the_nccl_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback = socket.if_nameindex()[0][1]
    single = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "NCCL_SOCKET_IFNAME": loopback}
    for name, value in single.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    seen = {}

    def init_process_group(**kwargs: object) -> None:
        seen["gloo"] = os.environ.get("GLOO_SOCKET_IFNAME")
        raise Joined

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    config = load_config([*ON_THIS_MACHINE, "distributed.backend=gloo", "distributed.device=cpu"])
    with pytest.raises(Joined), distributed(config.distributed):
        pass
    assert seen == {"gloo": loopback}
