"""Environment check before a long job: ``python -m <package>.doctor [key=value ...]``.

Takes the same overrides as training and prints one line per check, each problem with its fix, so a
broken driver, a taken port or an unreadable file shows up in seconds instead of after the allocation.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .config import Backend, Config, ConfigError, Device, load_config
from .config.cli import command_parser
from .config.constants import GPUS_PER_NODE, MODEL_TYPE
from .launch.lock import OutputDirBusy, refuse_if_in_use
from .model_type.checks import check_config
from .task.pretrained import PretrainedError, resolve_if_used

DESCRIPTION = """Checks this machine with the configuration training would use (the defaults plus the same
key=value overrides): versions, GPUs against processes per node, the backend with a 2-process all_reduce,
MASTER_PORT, output_dir (writable, not in use), the data files and the pretrained model. One line per
check; exit 0 when none failed, else 1."""

SMOKE_TIMEOUT_S = 60.0  # process start-up (importing torch) plus rendezvous; slower than this is a hang
OK, FAIL, SKIP = "ok", "FAIL", "skip"
CPU_FIX = "distributed.backend=gloo distributed.device=cpu"
Line = tuple[str, str]


def fail(problem: str, fix: str) -> Line:
    return FAIL, f"{problem}; fix: {fix}"


def config_problem(error: ConfigError) -> Line:
    # Config errors already read "<key>: <problem>; <fix>": keep the fix, in this command's format.
    problem, _, fix = str(error).partition("; ")
    return fail(problem, fix or "correct that key=value; every key is documented in config/schema.py")


def cuda_status(config: Config) -> Line:
    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "none"
        return OK, f"CUDA {torch.version.cuda}, NCCL {nccl}, {torch.cuda.device_count()} GPU(s) visible"
    if config.distributed.device is Device.cuda:
        return fail("distributed.device=cuda but CUDA is not available", f"use a GPU node, or {CPU_FIX}")
    return OK, "CUDA not available, 0 GPUs visible; not needed with distributed.device=cpu"


def processes_per_node() -> tuple[str, str]:
    """The count launch.sh starts on this node, and where it comes from (in launch.sh's order)."""
    for name in ("NPROC_PER_NODE", "PET_NPROC_PER_NODE"):
        if os.environ.get(name):
            return os.environ[name], name
    if GPUS_PER_NODE and "CUDA_VISIBLE_DEVICES" in os.environ:
        return str(torch.cuda.device_count()), "one per device in CUDA_VISIBLE_DEVICES"
    return str(max(GPUS_PER_NODE, 1)), "the project's default"


def gpus_for_processes(config: Config) -> Line:
    if config.distributed.device is Device.cpu or not torch.cuda.is_available():
        return SKIP, "GPUs per node: not checked with distributed.device=cpu or without CUDA"
    raw, source = processes_per_node()
    visible = torch.cuda.device_count()
    if not raw.isdigit() or int(raw) < 1:
        return fail(f"{source}={raw!r} is not a whole number >= 1", f"set NPROC_PER_NODE=1..{visible}")
    if int(raw) > visible:
        return fail(
            f"{raw} processes per node ({source}) but only {visible} GPU(s) visible",
            f"use NPROC_PER_NODE<={visible} or expose more GPUs in CUDA_VISIBLE_DEVICES",
        )
    return OK, f"{raw} process(es) per node ({source}), {visible} GPU(s) visible"


def backend_available(config: Config) -> Line:
    backend = config.distributed.backend
    if backend is Backend.nccl and not torch.cuda.is_available():
        return fail("distributed.backend=nccl needs CUDA, which is not available", CPU_FIX)
    if backend is Backend.nccl and not dist.is_nccl_available():
        return fail("this torch build has no NCCL", f"install a CUDA build of torch, or {CPU_FIX}")
    if backend is Backend.gloo and not dist.is_gloo_available():
        return fail("this torch build has no gloo", "install an official torch build (gloo is built in)")
    return OK, f"backend {backend.value} available"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _all_reduce_worker(rank: int, world: int, port: int, backend: str, device: str, results: Any) -> None:
    """One rank of the smoke test; each adds rank + 1, so the sum proves that every rank took part."""
    target = torch.device("cuda", rank % torch.cuda.device_count()) if device == "cuda" else None
    if target is not None:
        torch.cuda.set_device(target)
    timeout = timedelta(seconds=SMOKE_TIMEOUT_S)
    init = f"tcp://127.0.0.1:{port}"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=timeout)
    try:
        tensor = torch.tensor([rank + 1.0], device=target or "cpu")
        dist.all_reduce(tensor)
        results.put(tensor.item())
    finally:
        dist.destroy_process_group()


def smoke_test(config: Config, timeout_s: float = SMOKE_TIMEOUT_S) -> Line:
    backend, device = config.distributed.backend.value, config.distributed.device.value
    world = min(2, torch.cuda.device_count()) if backend == "nccl" else 2
    what = f"all_reduce on {backend}/{device}, {world} process(es)"
    what += ", one GPU each" if backend == "nccl" else ""
    debug = "NCCL_DEBUG=INFO" if backend == "nccl" else "TORCH_DISTRIBUTED_DEBUG=DETAIL"
    started, results = time.monotonic(), mp.get_context("spawn").SimpleQueue()
    args = (world, free_port(), backend, device, results)
    problem = wait_for(mp.spawn(_all_reduce_worker, args=args, nprocs=world, join=False), timeout_s)
    if problem:
        return fail(f"{what} {problem}", f"rerun with {debug} to see where it stops")
    sums, expected = [results.get() for _ in range(world)], world * (world + 1) / 2
    if any(total != expected for total in sums):
        return fail(f"{what} summed to {sums}, not {expected:g}", f"rerun with {debug}; check the driver")
    return OK, f"{what}: sum {expected:g} on every rank ({time.monotonic() - started:.1f} s)"


def wait_for(context: mp.ProcessContext, timeout_s: float) -> str | None:
    """What went wrong with the processes, None when all of them ended well; none is left running."""
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                return f"hung for {timeout_s:g} s"
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        return f"failed: {str(error).strip().splitlines()[-1]}"
    finally:
        for process in context.processes:  # a hung rank would otherwise outlive the doctor
            if process.is_alive():
                process.kill()
            process.join()
    return None


def master_port() -> Line:
    raw = os.environ.get("MASTER_PORT")
    if not raw:
        return OK, "MASTER_PORT unset: a single-node launch picks a free port"
    fix = "choose another MASTER_PORT, or unset it for single-node runs"
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        return fail(f"MASTER_PORT={raw!r} is not a port number", fix)
    try:
        with socket.socket() as sock:
            # As the rendezvous store binds it: a port in TIME_WAIT from an earlier job is still usable.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", int(raw)))
    except OSError as error:
        return fail(f"MASTER_PORT={raw} cannot be bound on this machine ({error.strerror})", fix)
    return OK, f"MASTER_PORT={raw} is free on this machine"


def output_dir_writable(config: Config) -> Line:
    directory = config.output_dir
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
    except OSError as error:
        fix = "choose a writable output_dir=... or fix the permissions of that directory"
        return fail(f"output_dir={directory} is not writable ({error.strerror})", fix)
    return OK, f"output_dir={directory} is writable"


def output_dir_free(config: Config) -> Line:
    try:
        refuse_if_in_use(Path(config.output_dir))
    except OutputDirBusy as busy:
        return config_problem(busy)
    return OK, f"output_dir={config.output_dir} is not in use by another run"


def pretrained_model(config: Config) -> Line:
    try:
        where = resolve_if_used(config.model.pretrained, MODEL_TYPE)
    except PretrainedError as error:
        return fail(error.problem, error.fix)
    if where is None:
        return SKIP, "model.pretrained: not used by this model type, or empty"
    return OK, f"model.pretrained={config.model.pretrained}: {where}"


def readable(key: str, value: str, config: Config) -> Line:
    if not value:  # check_config refused the empty paths that a run cannot do without
        synthetic = MODEL_TYPE == "custom" and not config.data.train_file
        meaning = "the synthetic example data is used" if synthetic else "no evaluation during training"
        return OK, f"{key} is empty: {meaning}"
    try:
        if Path(value).is_dir():
            os.listdir(value)
        else:
            with open(value, "rb") as handle:
                handle.readline(65536)  # bounded: a binary file need not have a newline
    except OSError as error:
        fix = f"fix its permissions or change {key}"
        return fail(f"{key}={value} is not readable ({error.strerror})", fix)
    return OK, f"{key}={value} is readable"


def data_files(config: Config) -> Iterator[Line]:
    try:
        check_config(config)
    except ConfigError as error:
        yield config_problem(error)
        return
    hub = getattr(config.data, "hub_dataset", "")  # the Hugging Face types' key
    if hub:  # it replaces the two files; a hub id is no path, checked when the run loads it
        yield OK, f"data.hub_dataset={hub}: loaded when the run starts (data.train_file/val_file not read)"
        return
    for key, value in (("data.train_file", config.data.train_file), ("data.val_file", config.data.val_file)):
        yield readable(key, value, config)


def checks(config: Config) -> Iterator[Line]:
    yield OK, f"python {sys.version.split()[0]} ({sys.executable})"
    yield OK, f"torch {torch.__version__}"
    prerequisites = [cuda_status(config), gpus_for_processes(config), backend_available(config)]
    yield from prerequisites
    if any(status == FAIL for status, _ in prerequisites):
        yield SKIP, "all_reduce smoke test: fix the problems above first"
    else:
        yield smoke_test(config)
    yield master_port()
    yield output_dir_writable(config)
    yield output_dir_free(config)
    yield from data_files(config)
    yield pretrained_model(config)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("doctor", DESCRIPTION)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for training")
    overrides: list[str] = parser.parse_args(argv).overrides
    try:
        lines: Iterator[Line] = checks(load_config(overrides))
    except ConfigError as error:
        lines = iter([config_problem(error)])
    failed = False
    for status, text in lines:
        print(f"{status:<5} {text}", flush=True)
        failed = failed or status == FAIL
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
