"""The bf16 prefill attention kernel (cpu_kernels/prefill_attention.cpp) on one ~3,000-token document, as the engine
runs it (chunks of core.prefill_chunk rows, each over all its keys so far), in GMAC/s (q·k and p·v multiply-adds of
causal attention: heads × dim × 2 × T(T+1)/2) and as a fraction of the bf16 peaks bench/cpu_peak.cpp measured
(pass them, GMAC/s on two threads: --peak-bf16 for vdpbf16ps, the instruction the kernel runs; --peak-amx-bf16).

    .venv/bin/python bench/prefill_attention_speed.py --tokens 3000 --peak-bf16 120 --peak-amx-bf16 3726
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root

SHAPES = {"smollm2-135m (9 heads, 3 kv, dim 64)": (9, 3, 64), "llama-1b (32 heads, 8 kv, dim 64)": (32, 8, 64)}


def document_seconds(heads: int, kv_heads: int, dim: int, tokens: int, chunk: int) -> float:
    """One document's prefill attention, chunk after chunk (the keys of each chunk already in the cache)."""
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(2, tokens, kv_heads, dim, generator=gen).bfloat16()
    q = torch.randn(tokens, heads, dim, generator=gen).bfloat16()
    slots = torch.arange(tokens)
    out = torch.empty_like(q)
    start = time.perf_counter()
    for first in range(0, tokens, chunk):
        rows = min(chunk, tokens - first)
        spans = torch.tensor([[0, rows, first + rows, 0]])
        torch.ops.kev.prefill_attention(q[first:first + rows], kv, out[first:first + rows], spans,
                                        slots[: first + rows], dim ** -0.5)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=128, help="core.prefill_chunk (the engine's default 128)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--peak-bf16", type=float, default=0.0)
    parser.add_argument("--peak-amx-bf16", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    assert load_cpu_kernels(cache_root()) and torch.ops.kev.prefill_attention_supported()
    print(f"# load average {os.getloadavg()}, {args.threads} threads, {args.tokens} tokens, chunks of {args.chunk}")
    print(f"| shape | ms (best of {args.repeat}) | GMAC/s | of vdpbf16ps peak | of AMX bf16 peak |")
    print("|---|---|---|---|---|")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        best = min(document_seconds(heads, kv_heads, dim, args.tokens, args.chunk) for _ in range(args.repeat))
        gmac = heads * dim * 2 * args.tokens * (args.tokens + 1) / 2 / best / 1e9
        shares = [f"{gmac / peak:.0%}" if peak else "-" for peak in (args.peak_bf16, args.peak_amx_bf16)]
        print(f"| {name} | {best * 1e3:.1f} | {gmac:.1f} | {shares[0]} | {shares[1]} |")
    print(f"# load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
