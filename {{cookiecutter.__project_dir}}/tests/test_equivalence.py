"""DDP computes what one large process would: same samples, same weights, same metrics, one all-reduce
per optimizer step, on one node or two. Runs real torchrun with 1, 2 and 3 gloo processes on CPU, in fp32."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PROJECT, free_port, launch_env, run_launch, start_launch
from safetensors.torch import load_file
from weights import final_weights

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


# Global batch 12 in every run: one process, two, three, and two accumulating over two micro-batches.
RUNS = {"1x12": (1, 12, 1), "2x6": (2, 6, 1), "3x4": (3, 4, 1), "2x3x2": (2, 3, 2)}
# float64 runs differ by the order of their sums only (relative 1e-15 and below); a scale bug moves every
# gradient by a factor such as the world size.
FLOAT64 = {"rtol": 1e-9, "atol": 1e-12}


def float64_probe(
    mode: str, run: str, overrides: list[str], tmp_path: Path, mutation: str = "none"
) -> dict[str, torch.Tensor]:
    """``run``: a key of RUNS, or "PxBxA" (processes x per-process batch x accumulation steps)."""
    nproc, batch, accumulation = RUNS.get(run) or tuple(int(part) for part in run.split("x"))
    result = tmp_path / f"{mode}-{run}-{mutation}.safetensors"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(PROJECT / "tests" / "float64_probe.py"), mode, str(result), mutation, *overrides,
        f"data.batch_size={batch}", f"train.grad_accum_steps={accumulation}",
        f"output_dir={tmp_path / f'{mode}-{run}-{mutation}'}",
    ]  # fmt: skip
    done = subprocess.run(command, env=launch_env(nproc), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return load_file(result)


def assert_same_tensors(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str
) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], **FLOAT64, msg=f"{what}: {name} differs")


@pytest.fixture(scope="module")
def first_step_gradients(deterministic_module, tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    directory = tmp_path_factory.mktemp("gradients")
    return {run: float64_probe("gradients", run, deterministic_module, directory) for run in RUNS}


@pytest.mark.every_type
def test_first_step_gradients_do_not_depend_on_world_size_or_accumulation(first_step_gradients) -> None:
    """The gradient the optimizer receives is that of the mean loss over the global batch, whatever the
    number of processes and micro-batches: compared before Adam could normalise a scale error away."""
    reference = first_step_gradients["1x12"]
    assert all(tensor.dtype == torch.float64 for tensor in reference.values())
    assert max(tensor.abs().max().item() for tensor in reference.values()) > 1e-3  # a real step
    for run in ("2x6", "3x4", "2x3x2"):
        assert_same_tensors(first_step_gradients[run], reference, run)


@pytest.mark.parametrize("mutation", ["loss_times_world_size", "no_accumulation_weight"])
def test_the_gradient_proof_catches_scale_bugs(
    first_step_gradients, deterministic_module, tmp_path: Path, mutation: str
) -> None:
    mutated = float64_probe("gradients", "2x3x2", deterministic_module, tmp_path, mutation)
    with pytest.raises(AssertionError):
        assert_same_tensors(mutated, first_step_gradients["1x12"], mutation)


def test_weights_after_sgd_steps_do_not_depend_on_world_size_or_accumulation(
    deterministic, tmp_path: Path
) -> None:
    steps = [*deterministic, "train.max_steps=3", "train.lr=0.05"]
    weights = {run: float64_probe("sgd", run, steps, tmp_path) for run in RUNS}
    start = float64_probe("sgd", "1x12", [*steps, "train.lr=1e-30"], tmp_path)  # ~ the initial weights
    assert any(
        not torch.allclose(weights["1x12"][name], start[name]) for name in start
    )  # training moved them
    for run in ("2x6", "3x4", "2x3x2"):
        assert_same_tensors(weights[run], weights["1x12"], run)


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
