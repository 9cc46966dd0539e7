"""The address this node is reached on in a multi-node job, found before torchrun starts.

Left alone, torchrun publishes the host's name for the workers' store and gloo binds to the address that
name resolves to. Where that is a loopback address (Debian writes ``127.0.1.1 <hostname>``; many container
images map the name to 127.0.0.1), the other nodes are told to connect to themselves and wait out the
whole timeout. Where a host has several interfaces, the name may resolve to one the other nodes cannot
reach. The address that routes to MASTER_ADDR is the one every other node can reach this node on, so the
launcher hands it to torchrun (``--local-addr``) and names its interface for gloo and NCCL.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import MutableMapping
from dataclasses import dataclass

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_PROBE_PORT = 9  # the discard port: connecting a UDP socket sends nothing, it only picks the route


class NodeAddressError(Exception):
    """This node has no address the other nodes can reach it on: one line naming the host and the fix."""


@dataclass(frozen=True)
class NodeAddress:
    address: str
    interface: str | None  # None where the interface cannot be named (IPv6, not Linux)


def interface_addresses() -> dict[str, str]:
    """Each interface's IPv4 address, by interface name (Linux); empty elsewhere."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it, or it is down
                continue
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback


def route_source(destination: str) -> str:
    """The address this host sends from to ``destination``: the kernel's choice of route, nothing sent."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((destination, _PROBE_PORT))
        return probe.getsockname()[0]


def find_node_address(master_addr: str, hostname: str) -> NodeAddress | None:
    """This node's address towards MASTER_ADDR, or None where every node runs on this machine (MASTER_ADDR
    is a loopback address by name or number, or this host has no other address)."""
    try:
        master = str(socket.getaddrinfo(master_addr, None, proto=socket.IPPROTO_TCP)[0][4][0])
    except (socket.gaierror, UnicodeError) as error:
        raise NodeAddressError(
            f"error: MASTER_ADDR={master_addr} does not resolve on {hostname} ({error}); set MASTER_ADDR to "
            "the first node's address, or to a name every node resolves"
        ) from None
    try:
        addresses = interface_addresses()
    except OSError:
        addresses = {}
    by_address = {address: name for name, address in addresses.items()}
    if not is_loopback(master):
        try:
            source = route_source(master)
        except OSError as error:
            raise NodeAddressError(
                f"error: {hostname} has no route to MASTER_ADDR={master_addr} ({master}): {error.strerror}; "
                "set MASTER_ADDR to an address of the first node that every node reaches"
            ) from None
        return NodeAddress(source, by_address.get(source))
    if master_addr == "localhost" or _is_address(master_addr):
        return None  # every node on this machine, as tests and a laptop run them
    # A name of this host that resolves to loopback here: this is the first node, seen through its own
    # hosts file. Its one other address is the one the others reach; with several, only the user knows.
    outward = {name: address for name, address in addresses.items() if not is_loopback(address)}
    if len(outward) == 1:
        ((name, address),) = outward.items()
        return NodeAddress(address, name)
    if not outward:
        return None
    listed = ", ".join(f"{address} ({name})" for name, address in sorted(outward.items()))
    raise NodeAddressError(
        f"error: MASTER_ADDR={master_addr} resolves to {master}, a loopback address, on {hostname}, which "
        f"has several interfaces ({listed}); set MASTER_ADDR to the address the other nodes reach "
        f"{hostname} on (or GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to its interface)"
    )


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def with_node_address(args: list[str], environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """torchrun's arguments with ``--local-addr`` added for a multi-node job, and gloo's and NCCL's
    interface set in ``environ`` (for the workers) where the user has not chosen one."""
    endpoint = next((arg.split("=", 1)[1] for arg in args if arg.startswith("--rdzv-endpoint=")), None)
    if endpoint is None or any(arg.startswith(("--local-addr", "--local_addr")) for arg in args):
        return args
    master_addr = endpoint.rsplit(":", 1)[0].strip("[]")
    found = find_node_address(master_addr, socket.gethostname())
    if found is None:
        return args
    if found.interface is not None:
        choose_interface(found.interface, environ)
    return [f"--local-addr={found.address}", *args]


def choose_interface(interface: str, environ: MutableMapping[str, str]) -> None:
    """gloo and NCCL on ``interface`` wherever the user's settings leave room for it.

    A user's GLOO_SOCKET_IFNAME stands, and so does an NCCL_SOCKET_IFNAME (gloo then follows it where it
    names other interfaces: parallel/process_group.py). An NCCL setting that admits ``interface`` (an
    exclusion such as ``^docker0,lo``, common in images, or a prefix such as ``eth``) tells gloo nothing
    it can use, as gloo takes one exact name: gloo gets ``interface``.
    """
    nccl = environ.get("NCCL_SOCKET_IFNAME", "").strip()
    if not environ.get("GLOO_SOCKET_IFNAME") and nccl_admits(nccl, interface):
        environ["GLOO_SOCKET_IFNAME"] = interface
    if not nccl:
        environ["NCCL_SOCKET_IFNAME"] = f"={interface}"  # "=": this name exactly, not a prefix


def nccl_admits(setting: str, interface: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME's ``setting`` lets NCCL use ``interface`` (empty: any interface).

    NCCL's syntax: a comma-separated list of name prefixes; ``=`` first for exact names; ``^`` first
    (before any ``=``) for a list to exclude."""
    if not setting:
        return True
    excluded = setting.startswith("^")
    listed = setting.removeprefix("^")
    exact = listed.startswith("=")
    names = [name.strip() for name in listed.removeprefix("=").split(",") if name.strip()]
    matches = any(interface == name or (not exact and interface.startswith(name)) for name in names)
    return matches != excluded
