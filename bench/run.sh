#!/usr/bin/env bash
# The bench in one command: set up .venv (the template's pinned test environment, which holds the
# peers too), then run every runner on every workload in interleaved rounds and print the table.
# Arguments go to bench/run.py, e.g. --rounds 5 or --workloads variable.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
exec .venv/bin/python bench/run.py "$@"
