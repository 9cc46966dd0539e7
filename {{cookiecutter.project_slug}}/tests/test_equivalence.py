"""DDP computes what one large process would: same samples, same weights, same metrics, one all-reduce
per optimizer step, on one node or two. Runs real torchrun with 1, 2 and 3 gloo processes on CPU, in fp32."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROJECT, final_weights, launch_env, run_launch, start_launch

pytestmark = [pytest.mark.slow, pytest.mark.ddp_guarantees]


def probe(mode: str, nproc: int, result: Path, overrides: list[str]) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(PROJECT / "tests" / "ddp_probe.py"), mode, str(result), *overrides,
    ]  # fmt: skip
    done = subprocess.run(command, env=launch_env(nproc), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(result.read_text())


def test_evaluation_is_identical_for_1_2_and_3_processes(deterministic, tmp_path: Path) -> None:
    overrides = [*deterministic, "data.batch_size=8", "data.eval_batch_size=7"]
    results = [
        probe("evaluate", n, tmp_path / f"eval{n}.json", [*overrides, f"output_dir={tmp_path / f'o{n}'}"])
        for n in (1, 2, 3)
    ]
    assert results[0] == results[1] == results[2]  # bitwise: the same floats, not merely close


def test_one_all_reduce_per_optimizer_step_and_identical_replicas(deterministic, tmp_path: Path) -> None:
    overrides = [*deterministic, "data.batch_size=4", "train.grad_accum_steps=4", f"output_dir={tmp_path}"]
    result = probe("sync", 2, tmp_path / "sync.json", overrides)
    assert result["buckets"] >= 1
    assert result["calls"] == result["steps"] * result["buckets"]  # no all-reduce on no_sync micro-steps
    assert result["divergence_detected"]


def test_world_size_and_accumulation_do_not_change_the_weights(deterministic, tmp_path: Path) -> None:
    runs = {  # name: (processes, per-process batch, accumulation); the global batch is 32 in each
        "one_process": (1, 32, 1),
        "two_processes": (2, 16, 1),
        "two_processes_accumulating": (2, 8, 2),
    }
    for name, (nproc, batch, accumulation) in runs.items():
        result = run_launch(
            [
                *deterministic,
                "train.epochs=1",
                f"data.batch_size={batch}",
                f"train.grad_accum_steps={accumulation}",
                f"output_dir={tmp_path / name}",
            ],
            nproc=nproc,
        )
        assert result.returncode == 0, result.stderr[-4000:]
    reference = final_weights(tmp_path / "one_process")
    for name in ("two_processes", "two_processes_accumulating"):
        weights = final_weights(tmp_path / name)
        worst = max((weights[key] - reference[key]).abs().max().item() for key in reference)
        assert worst <= 1e-5, f"{name}: max |difference| {worst:.2e}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_nodes_end_with_the_same_weights_as_one_node(deterministic, tmp_path: Path) -> None:
    """Two launch.sh processes with NNODES=2 and one process each meet in a c10d rendezvous on 127.0.0.1,
    as two machines would on MASTER_ADDR, and train what one node with two processes trains."""
    run = [*deterministic, "train.epochs=1", "data.batch_size=16"]
    one_node = run_launch([*run, f"output_dir={tmp_path / 'one_node'}"], nproc=2)
    assert one_node.returncode == 0, one_node.stderr[-4000:]

    port = free_port()
    rendezvous = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RUN_ID": f"r{port}"}
    # One output_dir, as on the shared storage of a real cluster: rank 0 writes, every rank reads.
    two_nodes = [*run, f"output_dir={tmp_path / 'two_nodes'}"]
    # The node that does not host the rendezvous starts first: it waits for the host.
    nodes = [start_launch(two_nodes, nproc=1, NODE_RANK=rank, **rendezvous) for rank in ("1", "0")]
    try:
        results = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                signal_group(node, signal.SIGKILL)
    for node, (_, stderr) in zip(nodes, results, strict=True):
        assert node.returncode == 0, stderr[-4000:]

    reference, result = final_weights(tmp_path / "one_node"), final_weights(tmp_path / "two_nodes")
    assert reference.keys() == result.keys()
    different = [name for name in reference if not torch.equal(reference[name], result[name])]
    assert different == [], "bitwise the same weights expected: the same ranks reduce the same gradients"


def signal_group(process: subprocess.Popen, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, number)
