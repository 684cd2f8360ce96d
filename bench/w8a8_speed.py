"""core.precision w8a8's kernel (cpu_kernels/w8a8_gemm.cpp) on a decoder layer's four linears (qkv, o, gate_up, down) of
the default model (SmolLM2-135M) and of the Llama-1B shape, per path (AMX tiles, AVX-512 VNNI, AVX2), at several row
counts, as GMAC/s and as a fraction of the peaks bench/cpu_peak.cpp measures (pass them: --peak-amx / --peak-vnni /
--peak-avx2, GMAC/s for the thread count used; AVX2's exact int8 peak is 32 MACs per `vpmaddwd`, twice its vpmaddwd
row). Each linear is timed on its own, the fastest of --reps calls (a shared machine's load only adds); random int8
weights (per-column scales) and rows in --dtype (bf16; fp32 is what w8a8 gets on a CPU without native bf16).
Reproduce: `.venv/bin/python bench/w8a8_speed.py --threads 2 --peak-amx 7453 --peak-vnni 942`."""
from __future__ import annotations

import argparse
import os
import time

import torch

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.quant_weight import W8A8_PATHS, QuantWeight, pack_w8a8, w8a8_paths
from kev.model.quantize import quantize_rows

SHAPES = {"135M": [(576, 960), (576, 576), (576, 3072), (1536, 576)],  # (in, out)
          "1B": [(2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048)]}


def fastest(w: QuantWeight, x: torch.Tensor, path: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        w.multiply(x, path)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--peak-amx", type=float, default=0.0)
    parser.add_argument("--peak-vnni", type=float, default=0.0)
    parser.add_argument("--peak-avx2", type=float, default=0.0)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    args = parser.parse_args()
    assert load_cpu_kernels(cache_root())
    torch.set_num_threads(args.threads)
    cpu = next(line for line in open("/proc/cpuinfo") if line.startswith("model name")).split(":")[1].strip()
    print(f"# {cpu}, {args.threads} threads, paths {w8a8_paths()}, load average {os.getloadavg()}")
    peaks = {"amx": args.peak_amx, "avx512-vnni": args.peak_vnni, "avx2": args.peak_avx2}
    paths = [p for p in peaks if p in w8a8_paths()]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print("| shape | M | " + " | ".join(f"{p} ms | {p} GMAC/s (of peak)" for p in paths) + " |")
    print("|---|---|" + "---|---|" * len(paths))
    gen = torch.Generator().manual_seed(0)
    for name, shapes in SHAPES.items():
        ws = [pack_w8a8(*quantize_rows(torch.randn(n, k, generator=gen))) for k, n in shapes]
        for rows in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(rows, k, generator=gen).to(dtype) for k, _ in shapes]
            macs = rows * sum(k * n for k, n in shapes)
            cells = []
            for path in paths:
                seconds = sum(fastest(w, x, W8A8_PATHS[path], args.reps) for w, x in zip(ws, xs))
                rate = macs / seconds / 1e9
                share = f" ({rate / peaks[path]:.0%})" if peaks[path] else ""
                cells.append(f"{seconds * 1e3:.3f} | {rate:.0f}{share}")
            print(f"| {name} | {rows} | " + " | ".join(cells) + " |", flush=True)
    print(f"# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
