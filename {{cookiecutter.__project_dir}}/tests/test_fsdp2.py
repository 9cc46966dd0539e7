"""distributed.strategy=fsdp2 under real torchrun with 2 gloo processes on CPU, in fp32 without dropout:
the sharded model trains what one process trains, resumes bit for bit on the same world size, and in the
same data order on another.

Three launches serve every test: one probe process group that trains fsdp2 (full and LoRA) and ddp side by
side, one uninterrupted fsdp2 run, and one killed run with background checkpoints. One-process runs, the
references, train in the test process itself.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    NO_ADAPTER_DROPOUT,
    ON_THIS_MACHINE,
    PROJECT,
    launch_env,
    read_metrics,
    run_launch,
    start_launch,
)
from process_tree import children, signal_all, workers_of
from safetensors.torch import load_file
from weights import without_dropout

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.config.constants import (
    MODEL_TYPE,
)
from {{ cookiecutter.package_name }}.loop.trainer import (
    Trainer,
)
from {{ cookiecutter.package_name }}.model_type.demo import (
    REPRODUCIBLE,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    TASK,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    distributed,
)

pytestmark = pytest.mark.slow
# The custom example declares no blocks: its Linear layers stand in for them here.
FSDP2 = ["distributed.strategy=fsdp2", *(["distributed.fsdp_wrap=Linear"] if MODEL_TYPE == "custom" else [])]
# The arithmetic bound of the equivalence proofs, as in test_equivalence.py.
ARITHMETIC_BOUND = 1e-5


@pytest.fixture(scope="session")
def still(demo, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The demo without dropout (its adapters' too), in fp32: runs that differ only by their arithmetic."""
    directory, overrides = demo
    model = without_dropout(directory / "model", tmp_path_factory.mktemp("still") / "model")
    kept = [item for item in overrides if not item.startswith(("model.pretrained=", "data.batch_size="))]
    still = [f"model.pretrained={model}", "train.precision=fp32", *REPRODUCIBLE, *NO_ADAPTER_DROPOUT]
    return [*ON_THIS_MACHINE, *kept, *still]


def max_difference(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> float:
    assert expected.keys() == actual.keys()
    return max((expected[name].float() - actual[name].float()).abs().max().item() for name in expected)


# --- Equivalence: 2 fsdp2 processes accumulating = 1 process = 2 ddp processes -----------------------
# Global batch 16: 2 processes x 4 samples x 2 micro-steps, or 1 process x 16. Clipping at 0.05 acts on
# every step, so a wrong cross-rank gradient norm would show.
EQUIVALENCE = [
    "train.max_steps=5",
    "train.lr=1e-3",
    "train.warmup_ratio=0",
    "train.max_grad_norm=0.05",
    "data.eval_batch_size=7",  # 15 evaluation batches: one rank runs a padding forward
    "data.num_workers=0",
    "checkpoint.every_steps=0",
    "distributed.timeout_s=120",  # a rank that waits for another's forward fails the test in minutes
]
TWO_PROCESSES = ["data.batch_size=4", "train.grad_accum_steps=2"]
LORA = MODEL_TYPE != "custom"  # LoRA adapters are for the Hugging Face model types
# Every parameter trains, whatever the project's defaults; or small adapters without dropout.
ADAPTERS = {"full": ["lora=null"], "lora": ["lora.r=4", "lora.alpha=8", "lora.dropout=0"]}


@pytest.fixture(scope="session")
def probed(still, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fsdp2 (full, and LoRA), and ddp: the same run, each in one process group of 2."""
    results = tmp_path_factory.mktemp("probe")
    base = [*still, *EQUIVALENCE, *TWO_PROCESSES]
    runs = {"full": [*base, *FSDP2, *ADAPTERS["full"]], "ddp": [*base, *ADAPTERS["full"]]}
    if LORA:
        runs["lora"] = [*base, *FSDP2, *ADAPTERS["lora"]]
    arguments = [
        f"{name}={','.join([*overrides, f'output_dir={results / name}'])}" for name, overrides in runs.items()
    ]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(PROJECT / "tests" / "fsdp2_probe.py"), str(results), *arguments,
    ]  # fmt: skip
    done = subprocess.run(command, env=launch_env(2), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return results


def probe_result(results: Path, name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((results / f"{name}.json").read_text()), torch.load(results / f"{name}.pt")


def one_process(overrides: list[str]) -> tuple[dict, dict[str, torch.Tensor]]:
    """The same run in this process (world size 1): the untrained model's evaluation, trained weights."""
    config = load_config(overrides)
    with distributed(config.distributed) as env:
        trainer = Trainer(config, TASK, env)
        trainer.evaluate()
        untrained = {key: value for key, value in trainer.last_eval.items() if key != "epoch"}
        trainer.fit()
        return untrained, {
            name: value.detach().clone() for name, value in trainer.state.module.state_dict().items()
        }


@pytest.mark.fsdp2
@pytest.mark.parametrize("adapters", ["full", "lora"])
def test_two_sharded_processes_accumulating_train_what_one_process_trains(
    probed: Path, still, tmp_path: Path, adapters: str
) -> None:
    if adapters == "lora" and not LORA:
        pytest.skip("LoRA adapters are for the Hugging Face model types")
    if adapters == "lora":
        pytest.importorskip("peft")
    sharded, weights = probe_result(probed, adapters)
    untrained, expected = one_process(
        [*still, *EQUIVALENCE, "data.batch_size=16", *FSDP2, *ADAPTERS[adapters], f"output_dir={tmp_path}"]
    )
    assert sharded["untrained"] == untrained  # evaluation is exact: bitwise the same metrics
    worst = max_difference(expected, weights)
    assert worst <= ARITHMETIC_BOUND, f"{adapters}: weights differ from one process by up to {worst:.2e}"


@pytest.mark.fsdp2
def test_fsdp2_trains_what_ddp_trains_with_a_reduce_scatter_per_step(probed: Path) -> None:
    (sharded, fsdp2_weights), (replicated, ddp_weights) = (
        probe_result(probed, "full"),
        probe_result(probed, "ddp"),
    )
    worst = max_difference(ddp_weights, fsdp2_weights)
    assert worst <= ARITHMETIC_BOUND, f"fsdp2 differs from ddp by up to {worst:.2e}"
    assert sharded["untrained"] == replicated["untrained"]
    single, accumulated = sharded["reduce_scatters"]
    assert single >= 1 and accumulated == single, (
        "gradients were reduced on a micro-step that is not the last"
    )


@pytest.mark.fsdp2
def test_parameters_and_optimizer_state_per_rank_take_at_most_0_6_of_ddp(probed: Path) -> None:
    sharded, replicated = probe_result(probed, "full")[0]["bytes"], probe_result(probed, "ddp")[0]["bytes"]
    ratio = sharded / replicated
    print(f"per rank, parameters + optimizer state: fsdp2 {sharded} B, ddp {replicated} B, ratio {ratio:.3f}")
    assert ratio <= 0.6


# --- Checkpoints: an uninterrupted run, and a killed one with background writes ------------------------
RUN = [
    "data.batch_size=8",
    "train.max_steps=8",
    "checkpoint.every_steps=3",
    "train.log_every_steps=1",
    "data.eval_batch_size=7",
    "data.num_workers=0",
]


@pytest.fixture(scope="session")
def sharded_reference(still, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output_dir = tmp_path_factory.mktemp("sharded-reference")
    result = run_launch([*still, *RUN, *FSDP2, f"output_dir={output_dir}"])
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir


def test_a_sharded_run_saves_sharded_checkpoints_and_a_whole_final_model(sharded_reference: Path) -> None:
    checkpoints = sorted(p for p in (sharded_reference / "checkpoints").iterdir())
    assert [p.name for p in checkpoints] == ["step-00000003", "step-00000006", "step-00000008"]
    for checkpoint in checkpoints:  # each rank's shards, DCP's index, and the rest of the state
        assert {p.name for p in checkpoint.iterdir()} == {
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "trainer.pt",
        }
    trainer = torch.load(checkpoints[-1] / "trainer.pt", weights_only=True)
    assert trainer["world_size"] == 2 and len(trainer["rng"]) == 2 and trainer["progress"]["step"] == 8
    weights = load_file(sharded_reference / "final" / "model.safetensors")
    assert all(tensor.dtype == torch.float32 for tensor in weights.values())  # the fp32 weights, whole
    config = sharded_reference / "final" / "config.json"
    if config.is_file() and "architectures" in json.loads(config.read_text()):
        assert not any(name.startswith("FSDP") for name in json.loads(config.read_text())["architectures"])
    evaluations = [r for r in read_metrics(sharded_reference) if "eval_loss" in r]
    assert [r["step"] for r in evaluations] == [8]


def wait_for_directory(output_dir: Path, launch: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not [p for p in (output_dir / "checkpoints").glob("step-*") if p.is_dir()]:
        assert launch.poll() is None, f"the run ended early: {launch.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)


@pytest.fixture(scope="session")
def killed(still, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run writing its checkpoints in the background, killed (SIGKILL) once the first is complete."""
    output_dir = tmp_path_factory.mktemp("killed")
    launch = start_launch([*still, *RUN, *FSDP2, "checkpoint.async=true", f"output_dir={output_dir}"])
    wait_for_directory(output_dir, launch)
    workers = workers_of(launch)
    signal_all(workers, signal.SIGSTOP)
    signal_all([launch.pid, *children(launch.pid), *workers], signal.SIGKILL)
    launch.wait()
    assert not (output_dir / "final").exists()
    return output_dir


@pytest.mark.fsdp2
def test_killed_background_checkpointing_run_resumes_to_the_same_weights(
    still, sharded_reference: Path, killed: Path, tmp_path: Path
) -> None:
    """Background checkpoints hold what synchronous ones hold; a write cut short by the kill (its
    temporary folder) and a torn newest checkpoint are passed over."""
    output_dir = tmp_path / "run"
    shutil.copytree(killed, output_dir)
    checkpoints = output_dir / "checkpoints"
    complete = sorted(p for p in checkpoints.iterdir() if p.name.startswith("step-"))
    (checkpoints / ".step-00000099.partial").mkdir()  # what a kill mid-write leaves
    (checkpoints / ".step-00000099.partial" / "__1_0.distcp").write_bytes(b"half a shard")
    torn = checkpoints / "step-00000098"
    shutil.copytree(complete[-1], torn)
    shard = torn / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])

    resumed = run_launch([*still, *RUN, *FSDP2, "checkpoint.async=true", f"output_dir={output_dir}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"skipping unreadable checkpoint {torn}" in resumed.stderr
    assert f"resumed from {complete[-1]}" in resumed.stderr
    assert not list(checkpoints.glob(".*partial"))
    steps = [r["step"] for r in read_metrics(output_dir) if "loss" in r]
    assert steps == [r["step"] for r in read_metrics(sharded_reference) if "loss" in r]
    reference = load_file(sharded_reference / "final" / "model.safetensors")
    result = load_file(output_dir / "final" / "model.safetensors")
    assert max_difference(reference, result) == 0.0  # bitwise: same world size, same arithmetic


@pytest.mark.fsdp2
def test_a_checkpoint_of_two_processes_resumes_on_one_in_the_same_data_order(
    still, sharded_reference: Path, killed: Path, tmp_path: Path
) -> None:
    """DCP reshards the 2-process checkpoint for one process; with the global batch kept (16 samples
    on one process), the sampler gives the steps left the same samples: the weights differ from the
    2-process run's by arithmetic only."""
    output_dir = tmp_path / "run"
    shutil.copytree(killed, output_dir)
    overrides = [*still, *RUN, *FSDP2, "data.batch_size=16", f"output_dir={output_dir}"]
    config = load_config(overrides)
    with distributed(config.distributed) as env:
        trainer = Trainer(config, TASK, env)
        resumed_at = trainer.state.progress.step
        trainer.fit()
    assert resumed_at >= 3
    steps = [r["step"] for r in read_metrics(output_dir) if "loss" in r]
    assert steps == [r["step"] for r in read_metrics(sharded_reference) if "loss" in r]
    reference = load_file(sharded_reference / "final" / "model.safetensors")
    result = load_file(output_dir / "final" / "model.safetensors")
    worst = max_difference(reference, result)
    assert worst <= ARITHMETIC_BOUND, f"the resumed run differs by up to {worst:.2e}"
