"""All of the process-group plumbing: ranks, device, init/teardown and the few collectives the loop uses.

A rank whose main thread is inside one of these functions is inside a collective (parallel/stuck_ranks.py
says so when a collective times out).

Every helper works without a process group too, so ``python -m <package>`` runs as one process with the
same code path as ``torchrun``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..config import Backend, ConfigError, Device, DistributedConfig
from .environment import WORKER_ROUND_ENV, launched_by_torchrun, restart_attempt

# A gloo group for small control messages (preemption flags) when the main backend is nccl, so they
# never wait for the GPU stream; None means the default group serves.
_cpu_group: dist.ProcessGroup | None = None


@dataclass(frozen=True)
class DistEnv:
    rank: int  # global rank: decides who writes (rank 0 only)
    local_rank: int  # rank on this node: decides the GPU
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """The one process that logs, writes metrics and saves checkpoints."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve_device(config: DistributedConfig, local_rank: int) -> torch.device:
    """The device of this process, from LOCAL_RANK: the global rank is wrong on every node but the first."""
    if config.device is Device.cpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        fix = "distributed.device=cpu distributed.backend=gloo"
        if config.backend is Backend.gloo:
            fix = "distributed.device=cpu"
        raise ConfigError(f"distributed.device: CUDA is not available on this machine; use {fix}")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
            "start at most that many processes per node (NPROC_PER_NODE)"
        )
    return torch.device("cuda", local_rank)


@contextmanager
def distributed(config: DistributedConfig) -> Iterator[DistEnv]:
    """Join the process group torchrun prepared (if any) and always leave it again."""
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    device = resolve_device(config, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if launched_by_torchrun():
        gloo_follows_nccl_interface(os.environ)
        timeout = timedelta(seconds=config.timeout_s)
        dist.init_process_group(
            backend=config.backend.value,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
            **_store_for_this_round(rank, world_size, timeout),
        )
        global _cpu_group
        _cpu_group = dist.new_group(backend="gloo") if config.backend is not Backend.gloo else None
    try:
        yield DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def gloo_follows_nccl_interface(
    environ: MutableMapping[str, str], interfaces: list[str] | None = None
) -> None:
    """Set GLOO_SOCKET_IFNAME from NCCL_SOCKET_IFNAME where only the latter is set.

    Every gloo group (the default one on CPU, the control group beside nccl) binds to the address the host
    name resolves to: 127.0.1.1 on Debian and Ubuntu, or a management interface the other nodes cannot
    reach. The interface chosen for NCCL is the one the nodes reach each other on. NCCL takes prefixes
    ("eth" for eth0, eth1), "=" for exact names and "^" for exclusions; gloo takes exact names only, so
    gloo gets the first interface of this machine that the NCCL setting selects, and nothing for
    exclusions.
    """
    wanted = environ.get("NCCL_SOCKET_IFNAME", "").strip()
    if environ.get("GLOO_SOCKET_IFNAME") or not wanted or wanted.startswith("^"):
        return
    exact = wanted.startswith("=")
    names = [name.strip() for name in wanted.lstrip("=").split(",") if name.strip()]
    present = interfaces if interfaces is not None else [name for _, name in socket.if_nameindex()]
    for interface in present:
        if any(interface == name or (not exact and interface.startswith(name)) for name in names):
            environ["GLOO_SOCKET_IFNAME"] = interface
            return


def _store_for_this_round(rank: int, world_size: int, timeout: timedelta) -> dict[str, Any]:
    """Rendezvous keys of this round of workers only.

    torchrun keeps its store across the rounds of a job, so without a prefix a started rank can read the
    address a stopped or dead rank published in an earlier round, and its connection then fails. The
    restart count is no name for the round: it stays when torchrun stops healthy workers to take in a
    joining node, and it differs between nodes when one node's workers failed and another's were stopped,
    whose workers would then wait for each other under different prefixes until the timeout. launch.sh's
    launcher names each round alike on every node; torchrun started without it, the restart count.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}  # another launcher (or none): the default env:// rendezvous
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    name = os.environ.get(WORKER_ROUND_ENV) or f"attempt-{restart_attempt()}"
    return {"store": dist.PrefixStore(name, store), "rank": rank, "world_size": world_size}


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def control_store() -> dist.Store | None:
    """The process group's key-value store (this round's own, see above), or None alone.

    For waits that may last longer than ``distributed.timeout_s`` (preprocessing): polling a key is no
    collective, so the process group's timeout does not end it.
    """
    if not is_distributed():
        return None
    return dist.distributed_c10d._get_default_store()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


@contextmanager
def main_process_first(env: DistEnv) -> Iterator[None]:
    """Let rank 0 fill a cache (download, preprocessing) before the others read it.

    Every rank enters both barriers, so this is safe to use around code that differs by rank.
    """
    if not env.is_main:
        barrier()
    try:
        yield
    finally:
        if env.is_main:
            barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def start_all_reduce_max_cpu(tensor: torch.Tensor) -> dist.Work | None:
    """Start an element-wise max across ranks of a CPU tensor, in place; wait() on the result, if any."""
    if not is_distributed():
        return None
    return dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_cpu_group, async_op=True)


def start_all_reduce_sum_cpu(tensor: torch.Tensor) -> dist.Work | None:
    """Start a sum across ranks of a CPU tensor, in place; wait_for() the result before reading it."""
    if not is_distributed():
        return None
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=_cpu_group, async_op=True)


def wait_for(work: dist.Work | None) -> None:
    """Wait for a collective started with ``async_op`` (None: there was none to start, alone)."""
    if work is not None:
        work.wait()


def broadcast_object(value: Any, env: DistEnv) -> Any:
    """Rank 0's value on every rank."""
    if not is_distributed():
        return value
    box = [value if env.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value: Any, env: DistEnv) -> list[Any]:
    """Every rank's value, in rank order, on every rank."""
    if not is_distributed():
        return [value]
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, value)
    return gathered
