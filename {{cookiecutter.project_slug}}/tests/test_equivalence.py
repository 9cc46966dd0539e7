"""DDP computes what one large process would: same samples, same weights, same metrics, one all-reduce
per optimizer step, on one node or two. Runs real torchrun with 1, 2 and 3 gloo processes on CPU, in fp32."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROJECT, final_weights, launch_env, run_launch, start_launch
from safetensors.torch import load_file

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


# A weight with a gradient moves by about train.lr each step. One whose true gradient is 0 (an attention
# key bias: softmax ignores a shift) moves by rounding only, which Adam scales up to lr x rounding / eps:
# such weights are held to the bound on what did not move, not to the bound on the arithmetic.
MOVED = 1e-4
ARITHMETIC_BOUND = 1e-5


def initial_weights(overrides: list[str]) -> dict[str, torch.Tensor]:
    model = Path(next(item for item in overrides if item.startswith("model.pretrained=")).split("=", 1)[1])
    weights = {}
    for file in model.glob("*.safetensors"):
        weights.update(load_file(file))
    return weights


def test_world_size_and_accumulation_do_not_change_the_weights(deterministic, tmp_path: Path) -> None:
    """The global batch of 36 does not divide the demo's training set: each epoch leaves a remainder
    out, and every world size must leave out the same samples."""
    runs = {  # name: (processes, per-process batch, accumulation); the global batch is 36 in each
        "one_process": (1, 36, 1),
        "two_processes": (2, 18, 1),
        "three_processes": (3, 12, 1),
        "two_processes_accumulating": (2, 9, 2),
    }
    for name, (nproc, batch, accumulation) in runs.items():
        result = run_launch(
            [
                *deterministic,
                "train.epochs=1",
                "train.lr=1e-3",
                f"data.batch_size={batch}",
                f"train.grad_accum_steps={accumulation}",
                f"output_dir={tmp_path / name}",
            ],
            nproc=nproc,
        )
        assert result.returncode == 0, result.stderr[-4000:]
    left_out = re.search(r"trains on \d+ of (\d+) samples", result.stderr)
    samples = int(left_out.group(1)) if left_out else 0
    assert samples % 36, f"{samples} training samples: no remainder, the test proves less than it says"
    start, reference = initial_weights(deterministic), final_weights(tmp_path / "one_process")
    for name in ("two_processes", "three_processes", "two_processes_accumulating"):
        weights = final_weights(tmp_path / name)
        assert weights.keys() == reference.keys()
        for key, expected in reference.items():
            difference = (weights[key] - expected).abs()
            initial = start.get(key)  # a new head has none: all of it counts as moved
            if initial is None or initial.shape != expected.shape:
                initial = torch.full_like(expected, float("inf"))
            moved = (expected - initial).abs() > MOVED
            worst = difference[moved].max().item() if moved.any() else 0.0
            assert worst <= ARITHMETIC_BOUND, f"{name}: {key} differs by up to {worst:.2e}"
            still = difference[~moved].max().item() if not moved.all() else 0.0
            assert still <= MOVED, f"{name}: {key} moved by up to {still:.2e} where one process did not"


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
