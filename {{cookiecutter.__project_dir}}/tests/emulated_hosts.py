"""Hosts emulated on this machine, as a cluster's nodes are: each is a network namespace with its own
address, hostname (a UTS namespace per command) and hosts file (`/etc/netns/<namespace>/hosts`, which
`ip netns exec` puts in place of /etc/hosts), and all are joined by veth pairs to one bridge that lives in a
namespace of its own (the switch). They share this machine's filesystem, as nodes share storage.

Everything is created per use and removed afterwards, also when the test fails; traffic flows only
between the namespaces made here. Where namespaces cannot be made (not root, no CAP_NET_ADMIN, no `ip`),
`unavailable()` says why in one line, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
SUBNET = "10.77.0"  # private to the namespaces made here: no route leads out of them
SECOND_SUBNET = "10.78"  # a host's second interface: 10.78.<host index>.1, reachable from no other host


@dataclass(frozen=True)
class Host:
    hostname: str
    namespace: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run on this host: in its namespace, under its own hostname, with its hosts file, and
        without this machine's choice of network interfaces (names these hosts lack)."""
        set_hostname_then_run = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "--",
                "env", "-u", "GLOO_SOCKET_IFNAME", "-u", "NCCL_SOCKET_IFNAME",
                "sh", "-c", set_hostname_then_run, self.hostname, *argv]  # fmt: skip


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why hosts cannot be emulated here, or None when they can."""
    missing = [tool for tool in ("ip", "unshare", "hostname") if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (iproute2, util-linux)"
    probe = f"probe-{secrets.token_hex(4)}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as error:
        return f"emulated hosts need network namespaces (root or CAP_NET_ADMIN): {error.stderr.strip()}"
    _ip("netns", "delete", probe)
    return None


@contextlib.contextmanager
def emulated_hosts(
    hostnames: Sequence[str],
    aliases: Sequence[Sequence[str]] = (),
    loopback_names: Collection[str] = (),
    second_interface: Collection[str] = (),
) -> Iterator[list[Host]]:
    """One host per name, at SUBNET.1, .2, ...; every hosts file names every host (with its `aliases`,
    as a cluster's DNS would), and its own line comes first, as Kubernetes writes a pod's.

    A host in `loopback_names` finds its own name at 127.0.1.1, as Debian writes it; one in
    `second_interface` has a second interface, eth1, on a network of its own (SECOND_SUBNET)."""
    tag = secrets.token_hex(3)
    switch = f"ddp-{tag}-switch"
    hosts = [Host(name, f"ddp-{tag}-h{i}", f"{SUBNET}.{i + 1}") for i, name in enumerate(hostnames)]
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(hosts):
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            port, end = f"s{tag}{i}", f"h{tag}{i}"  # interface names: at most 15 characters
            _ip("link", "add", port, "type", "veth", "peer", "name", end)
            _ip("link", "set", port, "netns", switch)
            _ip("link", "set", end, "netns", host.namespace)
            _ip("-n", host.namespace, "link", "set", end, "name", "eth0")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            for link in ("lo", "eth0"):
                _ip("-n", host.namespace, "link", "set", link, "up")
            if host.hostname in second_interface:
                # A veth pair whose far end stays in the host: a network no other host is on.
                _ip("-n", host.namespace, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1-far")
                _ip("-n", host.namespace, "addr", "add", f"{SECOND_SUBNET}.{i}.1/24", "dev", "eth1")
                for link in ("eth1", "eth1-far"):
                    _ip("-n", host.namespace, "link", "set", link, "up")
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
        extras = [*aliases, *[[]] * (len(hosts) - len(aliases))]
        names = [[*extra, host.hostname] for host, extra in zip(hosts, extras, strict=True)]
        for i, host in enumerate(hosts):
            order = [i, *(j for j in range(len(hosts)) if j != i)]
            lines = ["127.0.0.1\tlocalhost"] + [f"{hosts[j].address}\t{' '.join(names[j])}" for j in order]
            if host.hostname in loopback_names:
                lines[1] = f"127.0.1.1\t{' '.join(names[i])}"
            etc = NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(lines) + "\n", encoding="utf-8")
            # No DNS server: a name the hosts file lacks fails at once instead of after the timeouts.
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n", encoding="utf-8")
        yield hosts
    finally:
        for namespace in reversed(made):
            _kill_processes_in(namespace)
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only if no one else's namespaces are left in it


def _kill_processes_in(namespace: str) -> None:
    """A namespace outlives its name while a process is in it: no process may stay behind."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
