"""launch.sh builds the right torchrun command line; a fake ``python`` records what it runs: the launcher
(``-m <package>.launch.launcher``), which runs the config pre-check and then torchrun in its own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, PROJECT

SCRIPT = PROJECT / "launch.sh"
RENDERED_GPUS = int(re.search(r"RENDERED_GPUS_PER_NODE=(\d+)", SCRIPT.read_text()).group(1))
RENDERED_NODES = int(re.search(r"RENDERED_NUM_NODES=(\d+)", SCRIPT.read_text()).group(1))
gpu_project = pytest.mark.skipif(RENDERED_GPUS == 0, reason="GPU device selection: GPU projects only")


# What the Kubeflow training operator sets in the pod of PyTorchJob worker 1 of 4 (nprocPerNode "2").
OPERATOR_ENV = {
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "8",
    "RANK": "2",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "4",
    "PET_NODE_RANK": "2",
}
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# Every call is logged; the launcher prints torchrun's arguments, the signals it ignores (/proc's SigIgn
# mask), the run id, the malloc settings, the planned node count and the thread setting, then exits with
# LAUNCHER_EXIT.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls"
if [[ "$2" == *.launcher ]]; then
    shift 2
    printf "%s\n" "$@"
    grep "^SigIgn:" /proc/$$/status
    echo "LAUNCH_RUN_ID=${LAUNCH_RUN_ID-unset}"
    echo "MALLOC=${MALLOC_MMAP_THRESHOLD_:-}/${MALLOC_TRIM_THRESHOLD_:-}"
    echo "MAX_NNODES=$LAUNCH_MAX_NNODES"
    echo "OMP=$OMP_NUM_THREADS"
    exit "${LAUNCHER_EXIT:-0}"
fi
"""


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    return bin_dir


def launch(fake_bin: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "NPROC_PER_NODE",
            "NNODES",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NODE_RANK",
            "MAX_RESTARTS",
            "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS",
            "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TRIM_THRESHOLD_",
            "GLIBC_TUNABLES",
            "RUN_ID",
            "LAUNCH_MAX_NNODES",
            *OPERATOR_ENV,
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT",
        }
    }
    clean["PATH"] = f"{fake_bin}{os.pathsep}{clean['PATH']}"
    clean["NNODES"] = "1"  # single node unless a test says otherwise, whatever num_nodes was rendered
    clean.update(env)
    return subprocess.run([str(SCRIPT), *args], env=clean, capture_output=True, text=True, timeout=30)


def test_single_node_runs_standalone_and_passes_overrides_verbatim(fake_bin: Path) -> None:
    result = launch(fake_bin, "train.lr=1e-4", "output_dir=runs/a b", NPROC_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "--standalone" in lines and "--nproc-per-node=2" in lines and "--max-restarts=0" in lines
    assert not any(line.startswith(("--rdzv", "--master")) for line in lines)
    assert lines[lines.index("-m") + 1 : lines.index("-m") + 4] == [
        PACKAGE,
        "train.lr=1e-4",
        "output_dir=runs/a b",
    ]


def test_multi_node_uses_c10d_rendezvous(fake_bin: Path) -> None:
    result = launch(
        fake_bin, NPROC_PER_NODE="1", NNODES="2", MASTER_ADDR="10.1.2.3", MASTER_PORT="1234", NODE_RANK="1",
        MAX_RESTARTS="3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for expected in ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.1.2.3:1234",
                     "--rdzv-conf=is_host=false", "--max-restarts=3"]:  # fmt: skip
        assert expected in lines
    assert "--standalone" not in lines
    assert any(line.startswith("--rdzv-id=") for line in lines)
    assert "MAX_NNODES=2" in lines


@pytest.mark.parametrize(
    ("nnodes", "restarts", "expected"), [("1:2", "", "1"), ("2:4", "", "2"), ("1:2", "0", "0")]
)
def test_an_elastic_range_goes_to_torchrun_with_a_restart_per_node_it_may_lose(
    fake_bin: Path, nnodes: str, restarts: str, expected: str
) -> None:
    result = launch(fake_bin, NPROC_PER_NODE="1", NNODES=nnodes, MASTER_ADDR="n0", MAX_RESTARTS=restarts)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"--nnodes={nnodes}" in lines and f"--max-restarts={expected}" in lines
    assert f"MAX_NNODES={nnodes.split(':')[1]}" in lines  # the global batch is planned for the most nodes


def test_a_range_of_one_node_runs_standalone(fake_bin: Path) -> None:
    lines = launch(fake_bin, NPROC_PER_NODE="1", NNODES="1:1").stdout.splitlines()
    assert "--standalone" in lines and "--max-restarts=0" in lines and "MAX_NNODES=1" in lines


@pytest.mark.parametrize(("node_rank", "conf"), [("0", ["--rdzv-conf=is_host=true"]), ("", [])])
def test_node_zero_hosts_the_rendezvous(fake_bin: Path, node_rank: str, conf: list[str]) -> None:
    # c10d numbers the nodes itself; NODE_RANK decides who hosts the store. Unset, torchrun guesses.
    env = {"NPROC_PER_NODE": "1", "NNODES": "3", "MASTER_ADDR": "n0", "RUN_ID": "r7"}
    result = launch(fake_bin, **env, NODE_RANK=node_rank)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("--rdzv-conf")] == conf
    assert "--rdzv-id=r7" in lines


def test_torchruns_own_pet_variables_stand_in_for_ours(fake_bin: Path) -> None:
    """The environment of a Kubeflow PyTorchJob pod: no NNODES etc., but the operator's variables."""
    result = launch(fake_bin, "output_dir=/shared/run", **OPERATOR_ENV, NNODES="")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for expected in ["--nproc-per-node=2", "--nnodes=4", "--rdzv-endpoint=job-master-0:23456",
                     "--rdzv-conf=is_host=false", "--rdzv-backend=c10d"]:  # fmt: skip
        assert expected in lines
    assert lines[lines.index("-m") + 1 :][:2] == [PACKAGE, "output_dir=/shared/run"]

    ours = launch(fake_bin, **{**OPERATOR_ENV, "NPROC_PER_NODE": "1", "NNODES": "2", "NODE_RANK": "0"})
    lines = ours.stdout.splitlines()
    assert {"--nproc-per-node=1", "--nnodes=2", "--rdzv-conf=is_host=true"} <= set(lines)

    pet_master = launch(fake_bin, NPROC_PER_NODE="1", NNODES="2", PET_MASTER_ADDR="m", PET_MASTER_PORT="7")
    assert "--rdzv-endpoint=m:7" in pet_master.stdout.splitlines()


def test_torchrun_leaves_the_preemption_signals_to_the_workers(fake_bin: Path) -> None:
    # scancel, SLURM's --signal and Ctrl-C reach every process of the job, torchrun included: it must not
    # act on them (it would stop the workers and exit 1); the workers save a checkpoint. It starts with
    # them ignored and blocks them itself (launch/launcher.py), before torchrun's own handlers are installed.
    result = launch(fake_bin, NPROC_PER_NODE="1")
    mask = next(line for line in result.stdout.splitlines() if line.startswith("SigIgn:")).split()[1]
    ignored = int(mask, 16)
    assert all(ignored & (1 << (number - 1)) for number in PREEMPTION_SIGNALS)


def test_help_lists_the_launch_variables_with_their_values_and_starts_nothing(fake_bin: Path) -> None:
    result = launch(fake_bin, "--help", NPROC_PER_NODE="3", MASTER_ADDR="node0", MAX_RESTARTS="")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.count("usage: ./launch.sh") == 1
    rows = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.startswith("  "))
    names = ["NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RUN_ID", "MAX_RESTARTS"]
    assert set(names) <= rows.keys()
    assert rows["NPROC_PER_NODE"].startswith("3 ") and rows["MASTER_ADDR"].startswith("node0 ")
    assert rows["NNODES"].startswith("1 ") and rows["MAX_RESTARTS"].startswith("unset: 0, MAX-MIN if elastic")
    assert "75" in result.stdout  # the exit codes
    assert not (fake_bin / "calls").exists()  # no Python at all: no torch import, no second usage


@pytest.mark.parametrize(("launcher_exit", "expected"), [(0, 0), (75, 75), (1, 1), (137, 1)])
def test_exit_code_is_the_launchers_or_1(fake_bin: Path, launcher_exit: int, expected: int) -> None:
    result = launch(fake_bin, NPROC_PER_NODE="1", LAUNCHER_EXIT=str(launcher_exit))
    assert result.returncode == expected
    if launcher_exit == 137:  # killed: one line that says what happened and that a rerun resumes
        assert "ended with status 137" in result.stderr and "resumes" in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NNODES": "2"}, "needs MASTER_ADDR"),
        ({"NPROC_PER_NODE": "two"}, "NPROC_PER_NODE='two'"),
        ({"NPROC_PER_NODE": "0"}, "NPROC_PER_NODE='0'"),
        ({"NNODES": "0"}, "NNODES='0'"),
        ({"NNODES": "2", "MASTER_ADDR": "n0", "NODE_RANK": "2"}, "NODE_RANK='2'"),
        ({"NNODES": "2", "MASTER_ADDR": "n0", "NODE_RANK": "one"}, "NODE_RANK='one'"),
        ({"NNODES": "1:2"}, "NNODES=1:2 needs MASTER_ADDR"),
        ({"NNODES": "", "PET_NNODES": "2:1", "MASTER_ADDR": "n0"}, "NNODES='2:1' is not MIN:MAX"),
        ({"NNODES": "0:2", "MASTER_ADDR": "n0"}, "NNODES='0:2' is not MIN:MAX"),
        ({"NNODES": "1:two", "MASTER_ADDR": "n0"}, "NNODES='1:two' is not a whole number"),
        (
            {"NNODES": "1:2", "MASTER_ADDR": "n0", "NODE_RANK": "2"},
            "NODE_RANK='2' is not a whole number below NNODES=1:2",
        ),
        ({"MAX_RESTARTS": "-1"}, "MAX_RESTARTS='-1'"),
    ],
)
def test_bad_launch_variables_are_refused(fake_bin: Path, env: dict[str, str], message: str) -> None:
    result = launch(fake_bin, **{"NPROC_PER_NODE": "1", **env})
    assert result.returncode == 1
    assert message in result.stderr and result.stdout == ""


def test_one_python_process_runs_the_pre_check_and_torchrun_with_the_jobs_run_id(fake_bin: Path) -> None:
    """The launcher checks the config before torch (launcher.py): no Python start-up of its own for it."""
    result = launch(fake_bin, "bad.key=1", NPROC_PER_NODE="2")
    assert (fake_bin / "calls").read_text().splitlines()[0].startswith(f"-m {PACKAGE}.launch.launcher ")
    assert len((fake_bin / "calls").read_text().splitlines()) == 1
    assert "LAUNCH_RUN_ID=" in result.stdout.splitlines()  # a single node's: torchrun draws one
    env = {"NPROC_PER_NODE": "1", "NNODES": "3", "MASTER_ADDR": "n0", "RUN_ID": "r7"}
    assert "LAUNCH_RUN_ID=r7" in launch(fake_bin, **env).stdout.splitlines()  # past the lock of its own job


def test_one_omp_thread_per_process_unless_the_environment_sets_it(fake_bin: Path) -> None:
    for processes in ("1", "2"):
        assert launch(fake_bin, NPROC_PER_NODE=processes).stdout.splitlines()[-1] == "OMP=1"
    assert launch(fake_bin, NPROC_PER_NODE="2", OMP_NUM_THREADS="5").stdout.splitlines()[-1] == "OMP=5"


@pytest.mark.parametrize(("given", "threads"), [(None, "1"), ("3", "3")])
def test_python_m_defaults_to_one_omp_thread_too(given: str | None, threads: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env |= {"OMP_NUM_THREADS": given} if given else {}
    code = f"import os, {PACKAGE}.__main__; print(os.environ['OMP_NUM_THREADS'])"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == threads


def test_malloc_starts_tuned_unless_the_environment_tunes_it(fake_bin: Path) -> None:
    assert "MALLOC=33554432/67108864" in launch(fake_bin, NPROC_PER_NODE="2").stdout.splitlines()
    mine = launch(fake_bin, NPROC_PER_NODE="2", MALLOC_TRIM_THRESHOLD_="0").stdout.splitlines()
    assert "MALLOC=/0" in mine
    tunables = launch(fake_bin, NPROC_PER_NODE="2", GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert "MALLOC=/" in tunables.stdout.splitlines()


@gpu_project
def test_one_process_per_visible_gpu(fake_bin: Path) -> None:
    result = launch(fake_bin, CUDA_VISIBLE_DEVICES="0,2,3")
    assert "--nproc-per-node=3" in result.stdout.splitlines()


@gpu_project
def test_more_processes_than_visible_gpus_is_refused(fake_bin: Path) -> None:
    result = launch(fake_bin, CUDA_VISIBLE_DEVICES="0,1", NPROC_PER_NODE="4")
    assert result.returncode == 1
    assert "NPROC_PER_NODE=4 but only 2 GPU(s) are visible" in result.stderr


@gpu_project
def test_rendered_gpu_count_is_the_default(fake_bin: Path) -> None:
    result = launch(fake_bin)
    assert f"--nproc-per-node={RENDERED_GPUS}" in result.stdout.splitlines()


def test_rendered_node_count_is_the_default(fake_bin: Path) -> None:
    result = launch(fake_bin, NPROC_PER_NODE="1", NNODES="", MASTER_ADDR="10.1.2.3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    if RENDERED_NODES == 1:
        assert "--standalone" in lines
    else:
        assert f"--nnodes={RENDERED_NODES}" in lines and "--rdzv-endpoint=10.1.2.3:29500" in lines
