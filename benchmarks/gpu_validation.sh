#!/usr/bin/env bash
# make bench-gpu: the GPU validation on this node (benchmarks/gpu_validation.py says what it measures).
#   bash benchmarks/gpu_validation.sh [gpu_validation.py options]    # -> results/bench/<gpu-name>.md
# Refuses to start without a working NVIDIA driver; sized for about ten minutes on one H100 node.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "error: no NVIDIA GPU here (nvidia-smi missing or failing on $(hostname)); run make bench-gpu on a GPU node," \
         "e.g. srun --gpus-per-node=1 --pty make bench-gpu" >&2
    exit 2
fi
PY=${PYTHON:-$ROOT/.venv/bin/python}
nvidia-smi -L
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
exec "$PY" benchmarks/gpu_validation.py "$@"
