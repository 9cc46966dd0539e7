"""The doctor: one line per environment check, each problem with its fix, exit 1 when any check failed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ON_THIS_MACHINE, PACKAGE, PROJECT, launch_env
from process_tree import children

from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.config.constants import (
    GPUS_PER_NODE,
    MODEL_TYPE,
)
from {{ cookiecutter.package_name }}.doctor import (
    backend_available,
    data_files,
    gpus_for_processes,
    master_port,
    output_dir_free,
    output_dir_writable,
    pretrained_model,
    processes_per_node,
    smoke_test,
)
from {{ cookiecutter.package_name }}.launch.lock import OutputDirLock

# What a launcher or a cluster may have set in this shell; each test sets what it needs.
LAUNCH_VARIABLES = ("MASTER_PORT", "PET_MASTER_PORT", "PET_NPROC_PER_NODE")


def run_doctor(args: list[str], **env: str) -> subprocess.CompletedProcess:
    # One process per node: a GPU project's tests may run on a machine with a single GPU.
    environment = {k: v for k, v in launch_env(1).items() if k not in LAUNCH_VARIABLES}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.doctor", *ON_THIS_MACHINE, *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def failures(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL")]


def demo_paths(overrides: list[str]) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in overrides)
    return {key: pairs[key] for key in ("data.train_file", "data.val_file")}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*LAUNCH_VARIABLES, "NPROC_PER_NODE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.slow
def test_the_demo_passes_every_check(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    _, overrides = demo
    output_dir = tmp_path / "missing" / "run"
    result = run_doctor([*overrides, f"output_dir={output_dir}"])
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert all(line.startswith(("ok    ", "skip  ")) for line in lines), result.stdout
    assert f"ok    torch {torch.__version__}" in lines
    smoke = [line for line in lines if line.startswith("ok    all_reduce on ")]
    assert len(smoke) == 1 and "on every rank" in smoke[0], result.stdout
    assert any(line.startswith("ok    MASTER_PORT unset") for line in lines), result.stdout
    assert f"ok    output_dir={output_dir} is writable" in lines
    assert output_dir.is_dir() and not list(output_dir.iterdir()), "the probe file was left behind"
    for key, path in demo_paths(overrides).items():
        assert f"ok    {key}={path} is readable" in lines


@pytest.mark.slow
def test_a_missing_data_file_fails_naming_the_key_and_the_fix(
    demo: tuple[Path, list[str]], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.data"
    result = run_doctor([*demo[1], f"output_dir={tmp_path / 'out'}", f"data.train_file={missing}"])
    assert result.returncode == 1
    [line] = failures(result)
    assert line.startswith(f"FAIL  data.train_file='{missing}' does not exist; fix: "), line


@pytest.mark.slow
@pytest.mark.shared_core
def test_an_unwritable_output_dir_fails(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # unwritable beneath it even for root, unlike chmod
    output_dir = blocker / "run"
    result = run_doctor([*demo[1], f"output_dir={output_dir}"])
    assert result.returncode == 1
    [line] = failures(result)
    assert line.startswith(f"FAIL  output_dir={output_dir} is not writable"), line
    assert "; fix: choose a writable output_dir" in line


@pytest.mark.slow
@pytest.mark.shared_core
def test_a_master_port_in_use_fails(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_doctor([*demo[1], f"output_dir={tmp_path / 'out'}"], MASTER_PORT=str(port))
    assert result.returncode == 1
    [line] = failures(result)
    assert line.startswith(f"FAIL  MASTER_PORT={port} cannot be bound on this machine"), line
    assert line.endswith("; fix: choose another MASTER_PORT, or unset it for single-node runs")


def test_an_unknown_config_key_fails_in_one_line() -> None:
    result = run_doctor(["train.epoch=3"])
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"FAIL  train.epoch: unknown config key; "
        f"fix: python -m {PACKAGE}.config_reference lists the valid keys"
    ]


def test_help_exits_zero_without_checking() -> None:
    result = run_doctor(["--help"])
    assert result.returncode == 0
    words = " ".join(result.stdout.split())  # argparse wraps the usage after a long program name
    assert words.startswith(f"usage: python -m {PACKAGE}.doctor [-h] [key=value ...]")
    assert "FAIL" not in result.stdout and "ok    " not in result.stdout


def test_master_port_is_bound_to_check_it(clean_env: pytest.MonkeyPatch) -> None:
    assert master_port()[0] == "ok"
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    clean_env.setenv("MASTER_PORT", str(port))
    assert master_port() == ("ok", f"MASTER_PORT={port} is free on this machine")
    clean_env.setenv("MASTER_PORT", "http")
    assert master_port()[0] == "FAIL"


def test_a_hung_all_reduce_is_a_fail_line_and_its_processes_are_stopped() -> None:
    # Far too short for the processes to even import torch: the doctor must give up and clean up.
    status, text = smoke_test(load_config(ON_THIS_MACHINE), timeout_s=0.01)
    assert status == "FAIL" and " hung for " in text and "; fix: rerun with " in text
    workers = [pid for pid in children(os.getpid()) if b"spawn_main" in cmdline(pid)]
    assert workers == []


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # already gone
        return b""


def test_nccl_without_cuda_fails_with_the_cpu_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = load_config(["distributed.backend=nccl", "distributed.device=cuda", "train.precision=fp32"])
    status, text = backend_available(config)
    assert status == "FAIL"
    assert text.endswith("; fix: distributed.backend=gloo distributed.device=cpu")
    assert backend_available(load_config([*ON_THIS_MACHINE, "distributed.backend=gloo"]))[0] == "ok"


def test_more_processes_than_gpus_fails(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(torch.cuda, "is_available", lambda: True)
    clean_env.setattr(torch.cuda, "device_count", lambda: 1)
    on_gpus = load_config(["distributed.backend=nccl", "distributed.device=cuda", "train.precision=fp32"])
    clean_env.setenv("NPROC_PER_NODE", "2")
    status, text = gpus_for_processes(on_gpus)
    assert status == "FAIL" and "2 processes per node (NPROC_PER_NODE) but only 1 GPU(s)" in text
    assert "; fix: use NPROC_PER_NODE<=1" in text
    clean_env.setenv("NPROC_PER_NODE", "1")
    assert gpus_for_processes(on_gpus)[0] == "ok"
    on_cpu = load_config(["distributed.backend=gloo", "distributed.device=cpu", "train.precision=fp32"])
    clean_env.setenv("NPROC_PER_NODE", "2")
    assert gpus_for_processes(on_cpu)[0] == "skip"


def test_the_default_processes_per_node_is_the_one_launch_sh_starts(clean_env: pytest.MonkeyPatch) -> None:
    rendered = int(re.search(r"RENDERED_GPUS_PER_NODE=(\d+)", (PROJECT / "launch.sh").read_text()).group(1))
    assert rendered == GPUS_PER_NODE
    assert processes_per_node() == (str(max(rendered, 1)), "the project's default")
    clean_env.setenv("PET_NPROC_PER_NODE", "3")
    assert processes_per_node() == ("3", "PET_NPROC_PER_NODE")
    clean_env.setenv("NPROC_PER_NODE", "4")
    assert processes_per_node() == ("4", "NPROC_PER_NODE")


def test_an_empty_path_says_what_it_means(demo: tuple[Path, list[str]], tmp_path: Path) -> None:
    config = load_config([*ON_THIS_MACHINE, *demo[1], f"output_dir={tmp_path}", "data.val_file="])
    lines = list(data_files(config))
    assert lines[-1] == ("ok", "data.val_file is empty: no evaluation during training")
    assert all(status == "ok" for status, _ in lines)
    if MODEL_TYPE == "custom":
        synthetic = load_config([*ON_THIS_MACHINE, f"output_dir={tmp_path}", "data.train_file="])
        assert list(data_files(synthetic)) == [
            ("ok", "data.train_file is empty: the synthetic example data is used"),
            ("ok", "data.val_file is empty: the synthetic example data is used"),
        ]


def test_output_dir_check_leaves_only_the_directory(tmp_path: Path) -> None:
    output_dir = tmp_path / "new"
    config = load_config([*ON_THIS_MACHINE, f"output_dir={output_dir}"])
    assert output_dir_writable(config) == ("ok", f"output_dir={output_dir} is writable")
    assert list(tmp_path.iterdir()) == [output_dir] and not list(output_dir.iterdir())


def test_a_busy_output_dir_fails(tmp_path: Path) -> None:
    config = load_config([*ON_THIS_MACHINE, f"output_dir={tmp_path}"])
    assert output_dir_free(config) == ("ok", f"output_dir={tmp_path} is not in use by another run")
    mine = OutputDirLock(tmp_path)
    mine.acquire()
    try:
        status, text = output_dir_free(config)
    finally:
        mine.release()
    assert status == "FAIL" and f"output_dir={tmp_path} is in use by another run (host " in text
    assert text.endswith("; fix: wait for it to end, or choose another output_dir")


def test_the_pretrained_model_is_resolved(demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config([*ON_THIS_MACHINE, *demo[1], f"output_dir={tmp_path}"])
    status, text = pretrained_model(config)
    if MODEL_TYPE == "custom":  # no hub checkpoint to resolve
        assert status == "skip"
        return
    import huggingface_hub.constants

    assert status == "ok" and text.endswith(f"a local folder ({Path(config.model.pretrained).resolve()})")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    offline = load_config([*ON_THIS_MACHINE, *demo[1], "model.pretrained=someone/not-downloaded"])
    status, text = pretrained_model(offline)
    assert status == "FAIL" and "HF_HUB_OFFLINE is set" in text and str(tmp_path / "hub") in text
    assert "; fix: give the path of a local copy" in text
