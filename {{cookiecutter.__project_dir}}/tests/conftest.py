"""Shared fixtures: the offline demo assets, and running ``launch.sh`` with real torchrun processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from process_tree import abort_with_stacks, signal_all, wait_for_checkpoint, workers_of
from weights import without_dropout

from {{ cookiecutter.package_name }}.config import (
    Device,
    Precision,
    load_config,
)
from {{ cookiecutter.package_name }}.config.constants import MODEL_TYPE
from {{ cookiecutter.package_name }}.model_type.demo import (
    REPRODUCIBLE,
)
from {{ cookiecutter.package_name }}.model_type.demo import (
    build as build_demo,
)

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
# The metric each model type reports besides eval_loss.
METRIC = {
    "text-classification": "eval_accuracy",
    "causal-lm": "eval_perplexity",
    "image-classification": "eval_accuracy",
    "custom": "eval_accuracy",
    "token-classification": "eval_f1",
    "seq2seq": "eval_perplexity",
}[MODEL_TYPE]


def _on_this_machine() -> list[str]:
    """Overrides that let a GPU project's tests run where there is no CUDA; none for CPU projects."""
    config = load_config([])
    if torch.cuda.is_available() or config.distributed.device is Device.cpu:
        return []
    overrides = ["distributed.device=cpu", "distributed.backend=gloo"]
    if config.train.precision is Precision.fp16:  # CUDA only
        overrides.append("train.precision=bf16")
    return overrides


# Put first in every test run's overrides: a test's own later overrides still win.
ON_THIS_MACHINE = _on_this_machine()
# A project whose defaults train LoRA adapters (finetune=lora) gets them without dropout where runs must
# differ by their arithmetic only; elsewhere a lora.* override would add adapters.
NO_ADAPTER_DROPOUT = ["lora.dropout=0"] if load_config([]).lora is not None else []


# Every worker these tests start computes with one thread (launch_env), and so does this process: a
# result compared bitwise with a worker's must come from the same float sums, and the order of a sum
# depends on how many threads share it, whatever OMP_NUM_THREADS the user's shell has.
WORKER_THREADS = 1


def launch_env(nproc: int, **extra: str) -> dict[str, str]:
    """Environment for ``launch.sh``: this interpreter's torchrun first on PATH, the package importable."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{PROJECT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["NPROC_PER_NODE"] = str(nproc)
    env["NNODES"] = "1"  # one machine, whatever num_nodes the project was rendered with
    env["OMP_NUM_THREADS"] = str(WORKER_THREADS)
    env["PYTHONFAULTHANDLER"] = "1"  # a crash, or a hang that run_launch aborts, prints each thread's stack
    env.update(extra)
    return env


def run_launch(
    args: list[str], nproc: int = 2, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    """``launch.sh`` to its end. A run still going after ``timeout`` fails the test with its stderr and
    the Python stacks of all its processes, which say where it hung."""
    command = [str(PROJECT / "launch.sh"), *ON_THIS_MACHINE, *args]
    with subprocess.Popen(
        command,
        env=launch_env(nproc, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as launch:
        try:
            stdout, stderr = launch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = abort_with_stacks(launch)
            pytest.fail(f"launch.sh {' '.join(args)} still ran after {timeout:.0f} s:\n{stacks[-20000:]}")
    return subprocess.CompletedProcess(command, launch.returncode, stdout, stderr)


def start_launch(args: list[str], nproc: int = 2, **env: str) -> subprocess.Popen:
    """``launch.sh`` in the background, in its own session so a test can signal the whole job."""
    return subprocess.Popen(
        [str(PROJECT / "launch.sh"), *ON_THIS_MACHINE, *args],
        env=launch_env(nproc, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a rendezvous or a store of a test's own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def assert_checkpoint_at_stop(stderr: str, output_dir: Path) -> Path:
    """The step a preempted job says it stopped after has a checkpoint of its own: the stop saved it (the
    regular ones, every few steps, would let a resume start earlier and still end right)."""
    found = re.search(r"stopped by .*? after step (\d+)", stderr)
    assert found is not None, stderr[-3000:]
    checkpoint = output_dir / "checkpoints" / f"step-{int(found[1]):08d}.pt"
    assert checkpoint.is_file(), f"no checkpoint of step {found[1]}, where the job stopped"
    return checkpoint


def assert_resumed_from(checkpoint: Path, stderr: str) -> None:
    step = int(checkpoint.stem.removeprefix("step-"))
    assert f"resumed from {checkpoint} (step {step}," in stderr, stderr[-3000:]


def read_metrics(output_dir: Path) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="session", autouse=True)
def threads_of_the_workers() -> Iterator[None]:
    """The in-process references of the tests sum as the launched workers do (see WORKER_THREADS)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(WORKER_THREADS)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def offline_trackers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Whatever tracker the config names, tests never reach a server nor write into the project."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    database = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{database}")


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The offline demo's checkpoint and data, built once per test session."""
    directory = tmp_path_factory.mktemp("demo")
    overrides = [item for item in build_demo(directory) if not item.startswith("output_dir=")]
    return directory, overrides


@pytest.fixture(scope="session")
def trained(demo: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short two-process run on the demo, shared by the tests that inspect its outputs."""
    output_dir = tmp_path_factory.mktemp("run")
    _, overrides = demo
    result = run_launch(
        [
            *overrides,
            f"output_dir={output_dir}",
            "train.epochs=2",
            "checkpoint.every_steps=5",
            "train.peak_tflops=1",  # a peak for this CPU, so records carry mfu
        ]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir


# Runs that fault tests interrupt: long enough to be stopped mid-way, fp32 so results compare bitwise.
FAULT_RUN = ["train.precision=fp32", "train.epochs=2", "checkpoint.every_steps=4"]
# Rank 0 logs warnings only: the terminal then holds what a failure or a stop adds, and nothing else.
QUIET = ["log_level=warning"]


@pytest.fixture
def reap() -> Iterator[list[int]]:
    """The pids a test lists are killed when it ends, with their process groups: a failed test leaves no
    job running (paused workers, or workers that outlived their torchrun)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    signal_all(pids, signal.SIGKILL)


def interrupted_run(demo, output_dir: Path, *extra: str, **env: str) -> tuple[subprocess.Popen, list[int]]:
    """A fault run, its workers paused (SIGSTOP) at its first checkpoint: it cannot end before the fault."""
    launch = start_launch([*demo[1], *FAULT_RUN, *extra, f"output_dir={output_dir}"], **env)
    wait_for_checkpoint(output_dir, launch)
    workers = workers_of(launch)
    signal_all(workers, signal.SIGSTOP)
    return launch, workers


# Makes one process fail in Trainer.__init__ as a user error, a bug or a full disk would: the worker of
# global rank INJECT_RANK, or with INJECT_RANK=alone a process run without torchrun.
INJECTED_FAILURE = """
import errno, os
if os.environ.get("RANK", "alone") == os.environ.get("INJECT_RANK"):
    from {{ cookiecutter.package_name }}.data import loader as data
    from {{ cookiecutter.package_name }}.loop import trainer

    FAILURES = {
        "data": lambda: data.DataError("injected.jsonl:3: missing field 'label'"),
        "bug": lambda: RuntimeError("an injected bug"),
        "disk": lambda: OSError(errno.ENOSPC, "No space left on device", "/injected/step-00000001.pt"),
    }

    def fail(self, *args, **kwargs):
        raise FAILURES[os.environ["INJECT_FAILURE"]]()

    trainer.Trainer.__init__ = fail
"""


@pytest.fixture
def failing(tmp_path_factory: pytest.TempPathFactory):
    """``failing(rank, kind)``: the environment in which that process fails that way (INJECTED_FAILURE)."""
    folder = tmp_path_factory.mktemp("inject")
    (folder / "sitecustomize.py").write_text(INJECTED_FAILURE)

    def environment(rank: str, kind: str) -> dict[str, str]:
        path = f"{folder}{os.pathsep}{PROJECT / 'src'}"
        return {"PYTHONPATH": path, "INJECT_RANK": rank, "INJECT_FAILURE": kind}

    return environment


@pytest.fixture(scope="session")
def reference(demo: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run that interrupted runs must reproduce bit for bit."""
    output_dir = tmp_path_factory.mktemp("reference")
    result = run_launch([*demo[1], *FAULT_RUN, f"output_dir={output_dir}"])
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir


def deterministic_overrides(demo: tuple[Path, list[str]], directory: Path) -> list[str]:
    """Overrides for runs that differ by their arithmetic only: no dropout, fp32, no random augmentation."""
    demo_directory, overrides = demo
    model = without_dropout(demo_directory / "model", directory / "model")
    kept = [item for item in overrides if not item.startswith(("model.pretrained=", "data.batch_size="))]
    return [
        *ON_THIS_MACHINE,
        *kept,
        f"model.pretrained={model}",
        "train.precision=fp32",
        *REPRODUCIBLE,
        *NO_ADAPTER_DROPOUT,
    ]


@pytest.fixture
def deterministic(demo, tmp_path: Path) -> list[str]:
    return deterministic_overrides(demo, tmp_path)


@pytest.fixture(scope="module")
def deterministic_module(demo, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``deterministic``, shared by the tests of one module (its model copy is read-only)."""
    return deterministic_overrides(demo, tmp_path_factory.mktemp("deterministic"))
