#!/usr/bin/env bash
# Creates .venv (if missing) with the template's pinned test environment. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and alone: 2.13.0 is the CPU build; installing it before transformers keeps pip from
# choosing a multi-gigabyte CUDA build for a looser requirement.
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -r requirements-test.txt
