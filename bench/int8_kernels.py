"""Which int8 weight-only kernel Kev runs, decided by measurement: on the default model's linear stack (30 layers'
qkv / o / gate_up / down, distinct weights so they stream from memory as in a step, plus the tied head) at M rows,
Kev's int8 GEMM against torch's weight-only int8 op (aten._weight_int8pack_mm, what torchao's int8 weight-only
path calls on CPU) and Kev's bf16 GEMM; and whether each gives a row the same bits at every M.

    .venv/bin/python bench/int8_kernels.py [--threads 2] [--rows 1,16,64]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from gemm_vs_onednn import median_ms  # bench/ is the script's folder: sys.path[0]

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.linear import GemmWeight
from kev.model.model_store import cache_root
from kev.model.quantize import quantize_rows
from kev.model.row_invariance import probe_data

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 576, 1536, 49152, 30
SHAPES = [(960, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
Multiply = Callable[[torch.Tensor], torch.Tensor]


def torch_int8(q: torch.Tensor, scale: torch.Tensor) -> Multiply:
    scale_bf16 = scale.bfloat16()
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, q, scale_bf16)


def row_invariant(multiply: Multiply, in_features: int) -> bool:
    x = probe_data(80, in_features, 1).bfloat16()
    whole = multiply(x)
    return all(torch.equal(multiply(x[s:s + m]), whole[s:s + m]) for m in (1, 2, 3, 7, 16, 33, 64)
               for s in range(0, 80 - m + 1, max(m, 7)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,16,64")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_cpu_kernels(cache_root())
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=gen) * 0.05 for n, k in SHAPES] for _ in range(LAYERS)]
    weights.append([torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05])
    quantized = [[quantize_rows(w) for w in layer] for layer in weights]
    stacks: dict[str, list[list[Multiply]]] = {
        "kev int8": [[GemmWeight(q, None, s) for q, s in layer] for layer in quantized],
        "torch _weight_int8pack_mm": [[torch_int8(q, s) for q, s in layer] for layer in quantized],
        "kev bf16": [[GemmWeight(w.bfloat16(), None, None) for w in layer] for layer in weights],
    }
    print(f"{args.threads} threads; ms for the whole linear stack at M rows; row invariance on qkv's shape")
    for name, stack in stacks.items():
        times = []
        for m in (int(r) for r in args.rows.split(",")):
            calls = [(f, torch.randn(m, w.shape[1], generator=gen).bfloat16())
                     for layer, ws in zip(stack, weights) for f, w in zip(layer, ws)]
            times.append(f"M={m} {median_ms(lambda calls=calls: [f(x) for f, x in calls]):.1f}")
        print(f"{name:28s} {'  '.join(times)}  row-invariant: {row_invariant(stack[0][0], SHAPES[0][1])}")


if __name__ == "__main__":
    main()
