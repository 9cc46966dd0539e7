#!/usr/bin/env bash
# Runs training under torchrun. Every argument is a config override (key=value), passed on unchanged.
#
#   ./launch.sh                                   # this node, NPROC_PER_NODE processes
#   NPROC_PER_NODE=2 ./launch.sh train.lr=1e-4    # two processes, one override
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 ./launch.sh   # on each node of a multi-node job
#
# Environment (defaults rendered from the template answers):
#   NPROC_PER_NODE  processes on this node; default: one per visible GPU ({{ cookiecutter.gpus_per_node }} rendered), 1 on CPU
#   NNODES          number of nodes ({{ cookiecutter.num_nodes }}); 1 runs standalone on a free port; MIN:MAX (e.g. 1:2) is
#                   elastic: when nodes are lost, the job goes on with as few as MIN, at the same global batch
#   NODE_RANK       this node's index in a multi-node job, 0 on MASTER_ADDR (optional; see below)
#   MASTER_ADDR     rendezvous host of a multi-node job, the first node (required when NNODES > 1)
#   MASTER_PORT     rendezvous port of a multi-node job (default 29500)
#   MAX_RESTARTS    times torchrun restarts the whole group after a worker fails (default 0; MAX-MIN when
#                   NNODES is MIN:MAX, so the job goes on by itself down to MIN nodes)
#   RUN_ID          rendezvous id shared by the nodes of one job (default: derived from MASTER_ADDR:PORT)
# torchrun's own PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT stand in
# for the variables above where those are unset: the Kubeflow training operator sets them in each pod.
#
# Exit codes: 0 finished; 75 stopped for preemption after a checkpoint (SIGTERM, SIGUSR1 or Ctrl-C, to this
# script or to every process of the job; on every node); 1 an error, in one short message.
set -euo pipefail
# When this launch began, for the workers' start-up line (observe/phases.py); bash 5 reads it without a fork.
export LAUNCH_STARTED="${EPOCHREALTIME:-}"

readonly RENDERED_GPUS_PER_NODE={{ cookiecutter.gpus_per_node | int }}
readonly RENDERED_NUM_NODES={{ cookiecutter.num_nodes | int }}
readonly PREEMPTED_EXIT_CODE=75

die() {
    echo "launch.sh: error: $*" >&2
    exit 1
}

is_count() {
    [[ "$1" =~ ^[0-9]+$ ]] && (("$1" >= 1))
}

visible_gpus() {
    if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        local devices="${CUDA_VISIBLE_DEVICES//[[:space:]]/}"
        if [[ -z "$devices" || "$devices" == "-1" ]]; then
            echo 0
        else
            awk -F, '{ print NF }' <<<"$devices"
        fi
    elif command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true
    else
        echo ""
    fi
}

NPROC_PER_NODE="${NPROC_PER_NODE:-${PET_NPROC_PER_NODE:-}}"
NNODES="${NNODES:-${PET_NNODES:-}}"
NODE_RANK="${NODE_RANK:-${PET_NODE_RANK:-}}"
MASTER_ADDR="${MASTER_ADDR:-${PET_MASTER_ADDR:-}}"
MASTER_PORT="${MASTER_PORT:-${PET_MASTER_PORT:-}}"

# One launch variable for --help: its value now (or its default, when unset) and its meaning.
describe() {
    local value="${!1:-}"
    printf '  %-15s %-32s %s\n' "$1" "${value:-$2}" "$3"
}

usage() {
    local processes="unset: 1 (a CPU project)"
    if ((RENDERED_GPUS_PER_NODE > 0)); then
        processes="unset: one per GPU, else $RENDERED_GPUS_PER_NODE"
    fi
    cat <<EOF
usage: ./launch.sh [key=value ...]

Trains under torchrun with this project's defaults (src/{{ cookiecutter.package_name }}/config/defaults.yaml); every argument
overrides one of them, e.g. train.lr=1e-4 output_dir=outputs/run2. Check a machine first with
python -m {{ cookiecutter.package_name }}.doctor [key=value ...].

Launch variables, as set now:
$(describe NPROC_PER_NODE "$processes" "processes on this node")
$(describe NNODES "unset: $RENDERED_NUM_NODES" "nodes; 1 runs standalone; MIN:MAX is elastic")
$(describe NODE_RANK "unset" "this node's index in a multi-node job, 0 on MASTER_ADDR")
$(describe MASTER_ADDR "unset" "rendezvous host of a multi-node job (its first node)")
$(describe MASTER_PORT "unset: 29500" "rendezvous port of a multi-node job")
$(describe RUN_ID "unset: from MASTER_ADDR and PORT" "rendezvous id, the same on every node of a job")
$(describe MAX_RESTARTS "unset: 0, MAX-MIN if elastic" "times torchrun restarts the group after a worker fails")
PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT stand in for the first five.

Exit codes: 0 finished; 75 stopped after a checkpoint by SIGTERM, SIGUSR1 or Ctrl-C (run the same
command to resume; a second Ctrl-C stops at once, without one: 130); 1 an error.
EOF
}

for arg in "$@"; do
    if [[ "$arg" == "-h" || "$arg" == "--help" ]]; then
        usage
        exit 0
    fi
done

gpus="$(visible_gpus)"
if ((RENDERED_GPUS_PER_NODE == 0)); then
    nproc="${NPROC_PER_NODE:-1}"
elif [[ -n "${NPROC_PER_NODE:-}" ]]; then
    nproc="$NPROC_PER_NODE"
elif [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    nproc="$gpus"
    ((nproc >= 1)) || die "CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES}' leaves no GPU; set it to at least one device or set NPROC_PER_NODE"
else
    nproc="$RENDERED_GPUS_PER_NODE"
fi
is_count "$nproc" || die "NPROC_PER_NODE='$nproc' is not a whole number >= 1"
if ((RENDERED_GPUS_PER_NODE > 0)) && [[ -n "$gpus" ]] && ((gpus > 0 && nproc > gpus)); then
    die "NPROC_PER_NODE=$nproc but only $gpus GPU(s) are visible; use NPROC_PER_NODE<=$gpus or expose more devices in CUDA_VISIBLE_DEVICES"
fi

nnodes="${NNODES:-$RENDERED_NUM_NODES}"
if [[ "$nnodes" =~ ^([0-9]+):([0-9]+)$ ]]; then
    min_nodes="${BASH_REMATCH[1]}" max_nodes="${BASH_REMATCH[2]}"
    { is_count "$min_nodes" && ((10#$min_nodes <= 10#$max_nodes)); } ||
        die "NNODES='$nnodes' is not MIN:MAX with 1 <= MIN <= MAX (e.g. 1:2)"
    min_nodes=$((10#$min_nodes)) max_nodes=$((10#$max_nodes))
else
    is_count "$nnodes" || die "NNODES='$nnodes' is not a whole number >= 1, nor MIN:MAX (e.g. 1:2)"
    min_nodes=$((10#$nnodes)) max_nodes=$((10#$nnodes))
fi
max_restarts="${MAX_RESTARTS:-$((max_nodes - min_nodes))}"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS='$max_restarts' is not a whole number >= 0"

args=(--nproc-per-node="$nproc" --max-restarts="$max_restarts")
run_id="" # a single node's: torchrun draws one
if ((max_nodes == 1)); then
    # A local rendezvous on a free port: two jobs on one machine never collide.
    args+=(--standalone)
else
    [[ -n "${MASTER_ADDR:-}" ]] || die "NNODES=$nnodes needs MASTER_ADDR, the host every node can reach (e.g. the first node)"
    nnodes="$max_nodes"
    if ((min_nodes < max_nodes)); then
        nnodes="$min_nodes:$max_nodes" # torchrun's elastic form
    fi
    port="${MASTER_PORT:-29500}"
    run_id="${RUN_ID:-{{ cookiecutter.project_slug }}-$MASTER_ADDR-$port}"
    args+=(
        --nnodes="$nnodes"
        --rdzv-backend=c10d
        --rdzv-endpoint="$MASTER_ADDR:$port"
        --rdzv-id="$run_id"
    )
    if [[ -n "$NODE_RANK" ]]; then
        if [[ ! "$NODE_RANK" =~ ^[0-9]+$ ]] || ((10#$NODE_RANK >= max_nodes)); then
            die "NODE_RANK='$NODE_RANK' is not a whole number below NNODES=${NNODES:-$RENDERED_NUM_NODES}"
        fi
        # c10d numbers the nodes itself (torchrun ignores --node-rank for it). NODE_RANK decides which node
        # hosts the rendezvous store: node 0, on MASTER_ADDR. Without it torchrun guesses from the host
        # name, which misses where MASTER_ADDR is an alias of the first node (a DNS alias, a service).
        is_host=false
        if ((10#$NODE_RANK == 0)); then
            is_host=true
        fi
        args+=(--rdzv-conf="is_host=$is_host")
    fi
fi

# One OpenMP thread per process unless the environment says otherwise: on a machine other jobs share, a
# thread they deschedule stalls every parallel region of its process, many times slower than one thread
# (the README's Speed section has the bench's numbers). On a machine of your own, more processes
# (NPROC_PER_NODE) or OMP_NUM_THREADS=cores/processes may be faster.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# The nodes the global batch is planned for: on fewer (an elastic job that lost some), every process
# accumulates more micro-steps, so the optimizer sees the same global batch (run.py).
export LAUNCH_MAX_NNODES="$max_nodes"

# torch's C++ warnings off by default: when a node is lost, its store and gloo clients retry with a
# warning and a stack of 30 frames every few seconds until the project's one line names the node. Set
# TORCH_CPP_LOG_LEVEL=WARNING (or INFO) to see them.
export TORCH_CPP_LOG_LEVEL="${TORCH_CPP_LOG_LEVEL:-ERROR}"

# glibc's malloc maps (and unmaps) every block over 128 KiB from the kernel until some large block is freed,
# which then raises that bar; until then each step pays page faults for its activations, 10% of a small
# model's step on CPU. Start where its own heuristic ends (32 MiB, trimming past 64 MiB) unless the
# environment already tunes malloc.
if [[ -z "${MALLOC_MMAP_THRESHOLD_:-}${MALLOC_TRIM_THRESHOLD_:-}${GLIBC_TUNABLES:-}" ]]; then
    export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864
fi

# How this node's workers end, and this script's stop request, pass through files here (launch/status.py).
status_dir="$(mktemp -d "${TMPDIR:-/tmp}/{{ cookiecutter.project_slug }}-launch.XXXXXX")"
trap 'rm -rf "$status_dir"' EXIT

# Preemption: SIGTERM (a cancelled job, an eviction), SIGUSR1 (SLURM's warning before the time limit) and
# SIGINT (Ctrl-C), to this script alone or to every process of the job. This script asks the workers to
# stop (a file they read at every step, as they read their own signal flag); they agree on a step, save one
# checkpoint and exit; the launcher reports the stop and exits 75 on every node, so a scheduler can
# requeue, and the same command resumes. A second Ctrl-C stops at once, without a checkpoint.
stop_signal=""
# shellcheck disable=SC2329 # invoked by the traps below
request_stop() {
    if [[ "$1" == INT && -n "$stop_signal" ]]; then
        kill -KILL "$launcher_pid" 2>/dev/null || true # the workers die with it (launch/lifeline.py)
        echo "launch.sh: stopped at once by a second SIGINT, without a checkpoint;" \
            "the same command resumes from the newest one" >&2
        exit 130
    fi
    stop_signal="$1"
    echo "SIG$1" >"$status_dir/.stop" && mv -f "$status_dir/.stop" "$status_dir/stop"
}

# torchrun runs in the launcher, which keeps torchrun's report in a log file, shows the project's lines and
# leaves the preemption signals to the workers (launch/launcher.py): it starts with them ignored, then blocks them.
# Before torchrun, it refuses a bad override, a missing path or model, or an output_dir that another run
# holds here, in one line, before any process group is formed. The run id lets a node that joins its own
# job (a restarted pod) past the lock of that job.
trap '' TERM INT USR1
LAUNCH_STATUS_DIR="$status_dir" LAUNCH_RUN_ID="$run_id" \
    python -m {{ cookiecutter.package_name }}.launch.launcher "${args[@]}" -m {{ cookiecutter.package_name }} "$@" &
launcher_pid=$!
trap 'request_stop TERM' TERM
trap 'request_stop INT' INT
trap 'request_stop USR1' USR1

status=0
while :; do
    wait "$launcher_pid" && status=0 || status=$?
    kill -0 "$launcher_pid" 2>/dev/null || break # a trapped signal interrupted the wait; keep waiting
done
if [[ "$status" == 0 || "$status" == 1 || "$status" == "$PREEMPTED_EXIT_CODE" ]]; then
    exit "$status"
fi
echo "launch.sh: error: torchrun (pid $launcher_pid) ended with status $status, its workers with it;" \
    "the same command resumes from the newest checkpoint" >&2
exit 1
