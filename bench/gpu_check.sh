#!/usr/bin/env bash
# The GPU check, about 6 minutes on one CUDA GPU: nccl with world size 1, bf16, fp16 with the gradient
# scaler, torch.compile, fsdp2 (on all GPUs too); prints throughput and mfu (see bench/gpu_check.py).
#   bench/gpu_check.sh [--project DIR] [--cpu]
# PYTHON picks the interpreter (default: python3, which must hold a CUDA build of torch, transformers,
# omegaconf and tqdm; cookiecutter too unless --project names a rendered GPU causal-lm project).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
missing="$("$python" - <<'PY'
import importlib.util
names = ["torch", "transformers", "omegaconf", "tqdm", "safetensors", "tokenizers"]
print(" ".join(name for name in names if importlib.util.find_spec(name) is None))
PY
)"
if [[ -n "$missing" ]]; then
    echo "gpu_check: $python lacks $missing; install them (pip install $missing) or set PYTHON" >&2
    exit 1
fi
exec "$python" bench/gpu_check.py "$@"
