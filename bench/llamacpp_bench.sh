#!/usr/bin/env bash
# Kev (gguf, bf16) against llama.cpp's llama-server on the default Q4_1 GGUF and on Llama-1B-shaped random GGUFs
# (Q4_0, Q8_0), N = 1 / 16 / 64, then the logits check. Serialized with other benchmarks; records the machine and
# its load beside each result.   bench/llamacpp_bench.sh [python]
set -euo pipefail
py="${1:-.venv/bin/python}"
out=bench/results
facts() {
  { echo "processor: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
    echo "load before: $(uptime)"; } > "$1"
}
run() {  # name, then kev bench arguments
  local name=$1; shift
  facts "$out/llamacpp_$name.machine.txt"
  "$py" -m kev.cli.main bench --no-hf --no-invariance-cost --sizes 1,16,64 --against llamacpp --json \
    --out "$out/llamacpp_$name.json" "$@" > /dev/null
  echo "load after: $(uptime)" >> "$out/llamacpp_$name.machine.txt"
}
facts "$out/llamacpp_logits.machine.txt"
"$py" bench/llamacpp_logits.py
run default --precision gguf --compare-precision bf16 --max-tokens 64
run 1b_q4_0 --random-gguf Q4_0 --precision gguf --compare-precision bf16 --max-tokens 16
run 1b_q8_0 --random-gguf Q8_0 --precision gguf --max-tokens 16
# 16 new tokens after ~40-token prompts is mostly prefill at N=64; one question decoding 64 tokens, separately:
run 1b_q4_0_n1_64 --random-gguf Q4_0 --precision gguf --compare-precision bf16 --max-tokens 64 --sizes 1
