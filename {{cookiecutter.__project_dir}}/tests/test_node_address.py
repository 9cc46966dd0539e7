"""How a node picks the address it is reached on (launch/node_address.py), host by host; the end-to-end proof
on emulated hosts is tests/test_node_addresses.py."""

from __future__ import annotations

import socket
import sys

import pytest

from {{ cookiecutter.package_name }}.launch import node_address

NodeAddress, NodeAddressError, find_node_address = (
    node_address.NodeAddress,
    node_address.NodeAddressError,
    node_address.find_node_address,
)

MULTI_NODE = ["--nproc-per-node=1", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=host0:29500"]


@pytest.fixture
def host(monkeypatch):
    """A host with the given interfaces, where names resolve through `names`."""

    def make(interfaces: dict[str, str], names: dict[str, str]) -> None:
        def resolve(name, *args, **kwargs):
            if name[0].isdigit():
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (name, 0))]
            if name not in names:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[name], 0))]

        def route(destination: str) -> str:  # every destination off-host leaves through the first interface
            outward = [a for a in interfaces.values() if not a.startswith("127.")]
            return destination if destination in interfaces.values() else outward[0]

        monkeypatch.setattr(node_address.socket, "getaddrinfo", resolve)
        monkeypatch.setattr(node_address, "interface_addresses", lambda: interfaces)
        monkeypatch.setattr(node_address, "route_source", route)

    return make


def test_a_node_uses_the_address_that_routes_to_the_first_node(host) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.2", "eth1": "192.168.9.2"}, {"host0": "10.0.0.1"})
    assert find_node_address("host0", "host1") == NodeAddress("10.0.0.2", "eth0")


def test_the_first_node_named_on_loopback_uses_its_one_other_address(host) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.1"}, {"host0": "127.0.1.1"})
    assert find_node_address("host0", "host0") == NodeAddress("10.0.0.1", "eth0")


def test_the_first_node_named_on_loopback_with_several_addresses_is_refused(host) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.1", "eth1": "192.168.9.1"}, {"host0": "127.0.1.1"})
    listed = r"several interfaces \(10.0.0.1 \(eth0\), 192.168.9.1 \(eth1\)\)"
    with pytest.raises(NodeAddressError, match=listed):
        find_node_address("host0", "host0")


@pytest.mark.parametrize("master_addr", ["127.0.0.1", "localhost"])
def test_a_loopback_master_address_means_every_node_on_this_machine(host, master_addr: str) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.1", "eth1": "192.168.9.1"}, {"localhost": "127.0.0.1"})
    assert find_node_address(master_addr, "laptop") is None


def test_a_master_address_that_does_not_resolve_is_refused_in_one_line(host) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.2"}, {})
    with pytest.raises(NodeAddressError) as refused:
        find_node_address("node-zero", "host1")
    assert str(refused.value).startswith("error: MASTER_ADDR=node-zero does not resolve on host1 (")
    assert "\n" not in str(refused.value)


def test_torchrun_gets_the_address_and_gloo_and_nccl_the_interface(host) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.2"}, {"host0": "10.0.0.1"})
    environ: dict[str, str] = {}
    args = node_address.with_node_address(MULTI_NODE, environ)
    assert args == ["--local-addr=10.0.0.2", *MULTI_NODE]
    assert environ == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0"}


def test_the_users_interface_and_a_single_node_are_left_alone(host) -> None:
    host({"lo": "127.0.0.1", "eth0": "10.0.0.2"}, {"host0": "10.0.0.1"})
    environ = {"NCCL_SOCKET_IFNAME": "ib0"}
    assert node_address.with_node_address(MULTI_NODE, environ)[0] == "--local-addr=10.0.0.2"
    assert environ == {"NCCL_SOCKET_IFNAME": "ib0"}
    environ = {"GLOO_SOCKET_IFNAME": "eth9"}
    node_address.with_node_address(MULTI_NODE, environ)
    assert environ == {"GLOO_SOCKET_IFNAME": "eth9", "NCCL_SOCKET_IFNAME": "=eth0"}
    standalone = ["--nproc-per-node=2", "--standalone"]
    assert node_address.with_node_address(standalone, {}) == standalone


@pytest.mark.skipif(sys.platform != "linux", reason="interfaces are read the Linux way (an ioctl)")
def test_this_machine_has_a_loopback_interface_with_its_address() -> None:
    assert node_address.interface_addresses().get("lo") == "127.0.0.1"
    assert node_address.route_source("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize(
    ("nccl", "gloo"),
    [("^docker0,lo", "eth0"), ("^=eth", "eth0"), ("eth", "eth0"), ("=eth0", "eth0"),
     ("^eth", None), ("=eth", None), ("ib", None)],
)  # fmt: skip
def test_gloo_gets_the_interface_where_the_nccl_setting_admits_it(host, nccl: str, gloo: str | None) -> None:
    """An NCCL setting tells gloo (which takes one exact name) nothing where it only excludes interfaces
    or names a prefix: gloo gets the interface towards MASTER_ADDR where NCCL's setting admits it."""
    host({"lo": "127.0.0.1", "eth0": "10.0.0.2"}, {"host0": "10.0.0.1"})
    environ = {"NCCL_SOCKET_IFNAME": nccl}
    node_address.with_node_address(MULTI_NODE, environ)
    assert environ == {"NCCL_SOCKET_IFNAME": nccl, **({"GLOO_SOCKET_IFNAME": gloo} if gloo else {})}
