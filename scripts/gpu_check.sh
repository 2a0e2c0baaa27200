#!/usr/bin/env bash
# Check the GPU path: cp=4 trials of [4,1], [2,2], [1,4] with Transformer Engine on a node
# with >= 4 GPUs; one verdict line per layout, non-zero exit on any failure. Then the Bridge
# step: a [2,2] trial and its [1,4] p2p baseline as short Megatron-Bridge training runs of a
# 2-layer Llama-3-8B-shaped model, one verdict line each (--no-bridge skips it; --cpu says
# it was skipped: it needs GPUs, Megatron-Bridge and TE).
#   scripts/gpu_check.sh            # TE on the GPUs (profile dgx-h100: --cluster NAME)
#   scripts/gpu_check.sh --cpu      # the same trials with the torch reference on gloo
#   scripts/gpu_check.sh --one-gpu  # what one GPU can check (the default with 1-3 GPUs)
#   scripts/gpu_check.sh --first-session  # the first GPU session on one 8-GPU node, inside
#                                   # this allocation: steps side by side, 600 s deadline,
#                                   # results in ./gpu-check-<time>, a summary to paste
#   scripts/gpu_check.sh --dry      # that plan on CPU: each step's GPUs, estimate, the total
# Works from any folder. Python: $PYTHON if set, else the repo's .venv, else python3.
# The logic is hcp_tune/gpucheck/ (tested by tests/gpucheck/test_gpu_check.py).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ -x "$repo/.venv/bin/python" ]]; then
    py="$repo/.venv/bin/python"
else
    py=python3
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m hcp_tune.gpucheck "$@"
