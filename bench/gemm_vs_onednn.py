"""Kev's GEMM (kev/model/cpu_kernels/linear_gemm.cpp) against oneDNN's prepacked path on the default model's
linear stack (30 layers' qkv / o / gate_up / down with distinct weights, so they stream from memory as in
a real step, plus the tied lm_head), bf16, at M rows; also checks that Kev's rows never depend on M.

    .venv/bin/python bench/gemm_vs_onednn.py [--threads 2] [--rows 1,16,64]
"""
from __future__ import annotations

import argparse
import time

import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.linear import GemmWeight, PackedWeight, can_use_kev_gemm
from kev.model.model_store import cache_root

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 576, 1536, 49152, 30
SHAPES = [(960, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]


def median_ms(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,16,32,64,128,512", help="row counts M, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_cpu_kernels(cache_root())
    gen = torch.Generator().manual_seed(0)
    weights = [[(torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16) for n, k in SHAPES] for _ in range(LAYERS)]
    head = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05).to(torch.bfloat16)
    if not can_use_kev_gemm(head):
        raise SystemExit("Kev's GEMM needs AVX-512 BF16 and the C++ kernels")
    kev_stack = [[GemmWeight(w, None, None) for w in layer] for layer in weights] + [[GemmWeight(head, None, None)]]
    x = torch.randn(80, INTERMEDIATE, generator=gen).to(torch.bfloat16)
    reference = kev_stack[0][3](x)
    same = all(torch.equal(kev_stack[0][3](x[:m]), reference[:m]) for m in range(1, 81))
    print(f"Kev's GEMM rows identical at every M in 1..80: {same}")
    print(f"{'M':>5} {'Kev ms':>8} {'oneDNN ms':>10} {'oneDNN / Kev':>13}")
    for m in (int(r) for r in args.rows.split(",")):
        onednn = [[PackedWeight(w, None, m) for w in layer] for layer in weights] + [[PackedWeight(head, None, m)]]
        timings = []
        for stack in (kev_stack, onednn):
            inputs = [[torch.randn(m if i < LAYERS else min(m, 64), w.shape[1], generator=gen).to(torch.bfloat16)
                       for w in layer] for i, layer in enumerate(weights + [[head]])]

            def run(stack=stack, inputs=inputs) -> None:
                for layer, xs in zip(stack, inputs):
                    for multiply, rows in zip(layer, xs):
                        multiply(rows)

            timings.append(median_ms(run))
        print(f"{m:>5} {timings[0]:>8.1f} {timings[1]:>10.1f} {timings[1] / timings[0]:>12.2f}x")


if __name__ == "__main__":
    main()
