"""The decode attention kernel (cpu_kernels/paged_attention.cpp) as a step runs it: N channels of L keys each in a paged
cache (blocks of 16 slots, shuffled), one cache per layer for 30 layers (so at N=64 the keys stream from memory as in
the engine), 9 heads over 3 kv heads, dim 64, bf16 or fp32 (--dtype; the default model's shape). Prints ms per step (30 calls), the
fastest of --repeats, and writes the last output to --out (compare two trees' outputs: a change that should keep the
bits must give the same tensor).

    .venv/bin/python bench/decode_attention_speed.py --threads 1 --channels 64 --keys 100
"""
from __future__ import annotations

import argparse
import time

import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root

HEADS, KV_HEADS, DIM, LAYERS, BLOCK = 9, 3, 64, 30, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="", help="save the last output here (torch.save)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="K/V and queries (fp32: what a CPU without native bf16 runs)")
    args = parser.parse_args()
    assert load_cpu_kernels(cache_root())
    torch.set_num_threads(args.threads)
    n, length = args.channels, args.keys
    gen = torch.Generator().manual_seed(0)
    blocks = -(-length // BLOCK)
    order = torch.randperm(n * blocks + 8, generator=gen)
    slots = torch.cat([(order[c * blocks:(c + 1) * blocks, None] * BLOCK + torch.arange(BLOCK)).flatten()[:length]
                       for c in range(n)])
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    caches = [torch.randn(2, (n * blocks + 8) * BLOCK, KV_HEADS, DIM, generator=gen).to(dtype) for _ in range(LAYERS)]
    q = torch.randn(n, HEADS, DIM, generator=gen).to(dtype)
    out = torch.empty_like(q)
    rows, starts, lengths = torch.arange(n), torch.arange(n) * length, torch.full((n,), length)
    best = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        for kv in caches:
            torch.ops.kev.paged_attention(q, kv, out, rows, slots, starts, lengths, DIM ** -0.5)
        best = min(best, time.perf_counter() - started)
    print(f"{args.threads} threads, {n} channels x {length} keys x {LAYERS} layers: {best * 1e3:.2f} ms a step")
    if args.out:
        torch.save(out, args.out)


if __name__ == "__main__":
    main()
