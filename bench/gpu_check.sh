#!/usr/bin/env bash
# The one prepared command for a GPU machine lent now and then: no network there, PyTorch and
# transformers present, no vLLM, the repository carried (well under 64 MiB). Nothing is installed:
# the check imports only torch, transformers and this file, from the carried tree (PYTHONPATH).
# Prints one JSON line per shape (Qwen2.5 0.5B then 3B, random weights, bf16): step time, rollout
# tokens/s, peak GPU memory; each shape takes a few minutes at most, inside the 10 minutes a command.
#   bash bench/gpu_check.sh             on the GPU
#   bash bench/gpu_check.sh --dry-run   on a CPU: the same code, 2 layers, fp32, a few tokens
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" bench/gpu_check.py "$@"
