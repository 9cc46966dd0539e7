#!/usr/bin/env bash
# The whole product in one command, offline on CPU: set up .venv, render a CPU text-classification
# project into build/demo-project, build its tiny local checkpoint and demo data, fine-tune it with
# 2 processes through its launch.sh, and print the trained model's evaluation metrics.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup-env.sh
export PATH="$root/.venv/bin:$PATH"

rm -rf build/demo-project
python -m cookiecutter --no-input --output-dir build "$root" \
    project_name="Demo Project" project_slug=demo-project model_type=text-classification \
    gpus_per_node=0 backend=gloo precision=fp32
cd build/demo-project
python -m pip install --quiet -e .

python -m demo_project.demo demo
read -r -a overrides <demo/overrides.txt
NPROC_PER_NODE=2 ./launch.sh "${overrides[@]}"

echo
echo "Evaluation of the fine-tuned model (build/demo-project/outputs/demo/metrics.jsonl):"
grep eval_loss outputs/demo/metrics.jsonl | tail -n 1
echo "Fine-tuned model: build/demo-project/outputs/demo/final/"
