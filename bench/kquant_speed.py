"""One linear layer of the Llama-1B shape (2048 -> 8192, and 8192 -> 2048) on Kev's quantized-activation kernel:
Q4_K / Q5_K / Q6_K super-blocks beside Q4_0 and Q8_0 blocks, at M = 1 and M = 64, 2 threads. Each type's calls
rotate over 6 copies of the weight (more than the last-level cache), so M = 1 streams its bytes from memory; the
types take turns call by call, and the fastest and the median call are reported (a shared machine's load only adds). Random blocks (kev/bench/random_gguf.py's random_blocks) read back through a one-tensor GGUF as the engine reads them.
Reproduce: `flock /tmp/kev-bench.lock .venv/bin/python bench/kquant_speed.py`.

`--rows 1,16,64 --peak-int8 942 --peak-amx-int8 7453 --peak-bf16 120` adds w8a8 (cpu_kernels/w8a8_gemm.cpp) and bf16
(Kev's GEMM, cpu_kernels/linear_gemm.cpp) beside the GGUF types at those row counts, as GMAC/s and as a fraction of
the peaks bench/cpu_peak.cpp measured (bench/results/cpu_peak.md, two threads: vpdpbusd 942 and vdpbf16ps 120 GMAC/s
on the AMX Xeon; w8a8 runs AMX tiles from 4 rows, so from M = 4 its fraction is of AMX int8's 7,453)."""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kev.bench.random_gguf import random_quant_weight
from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.linear import GemmWeight
from kev.model.quant_weight import QuantWeight, active_path, pack_w8a8, w8a8_paths
from kev.model.quantize import quantize_rows

TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
SHAPES = [(2048, 8192), (8192, 2048)]  # (in, out)


def timings(ws: dict[str, list[QuantWeight]], x: torch.Tensor, rounds: int) -> dict[str, list[float]]:
    """ms per call, the types interleaved call by call so that the machine's load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in ws}
    for copies in ws.values():
        copies[0](x)
    for i in range(rounds):
        for name, copies in ws.items():
            start = time.perf_counter()
            copies[i % len(copies)](x)
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def fractions(args: argparse.Namespace) -> None:
    """GMAC/s and the fraction of the peak for each type (GGUF Q4_0 / Q8_0, w8a8, bf16) at each row count."""
    rows = [int(r) for r in args.rows.split(",")]
    peaks = {"Q4_0": args.peak_int8, "Q8_0": args.peak_int8, "w8a8": args.peak_int8, "bf16": args.peak_bf16}
    print("| type | shape (in→out) | " + " | ".join(f"M={m} ms (min) | GMAC/s (of peak)" for m in rows) + " |")
    print("|---|---|" + "---|---|" * len(rows))
    with tempfile.TemporaryDirectory() as folder:
        for k, n in SHAPES:
            ws: dict[str, list] = {}
            for name in ("Q4_0", "Q8_0"):
                w = random_quant_weight(Path(folder), name, k, n)
                ws[name] = [w] + [QuantWeight(w.cells.clone(), None, None, w.kind, n, k, name) for _ in range(5)]
            dense = [torch.randn(n, k, generator=torch.Generator().manual_seed(i)) * 0.02 for i in range(6)]
            ws["w8a8"] = [pack_w8a8(*quantize_rows(d)) for d in dense]
            ws["bf16"] = [GemmWeight(d.bfloat16(), None, None) for d in dense]
            best = {m: {name: min(t) for name, t in timings(ws, torch.randn(m, k).bfloat16(), 300 if m == 1 else 100
                                                            ).items()} for m in rows}
            for name in ws:
                cells = []
                for m in rows:
                    rate = m * k * n / best[m][name] / 1e6
                    amx = name == "w8a8" and m >= 4 and w8a8_paths()[:1] == ("amx",)
                    peak = args.peak_amx_int8 if amx else peaks[name]
                    share = f" ({rate / peak:.0%})" if peak else ""
                    cells.append(f"{best[m][name]:.3f} | {rate:.0f}{share}")
                print(f"| {name} | {k}→{n} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="e.g. 1,16,64: the fractions-of-peak table (GGUF, w8a8, bf16)")
    parser.add_argument("--peak-amx-int8", type=float, default=0.0, help="GMAC/s, two threads (tdpbusd): w8a8 at M>=4")
    parser.add_argument("--peak-int8", type=float, default=0.0, help="GMAC/s, two threads (vpdpbusd)")
    parser.add_argument("--peak-bf16", type=float, default=0.0, help="GMAC/s, two threads (vdpbf16ps)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    assert load_cpu_kernels(cache_root())
    cpu = next(line for line in open("/proc/cpuinfo") if line.startswith("model name")).split(":")[1].strip()
    print(f"# {cpu}, {platform.machine()}, kernel path {active_path()}, load average {os.getloadavg()}")
    if args.rows:
        fractions(args)
        print(f"# load average at the end {os.getloadavg()}")
        return
    print("| type | shape (in→out) | bytes | M=1 ms (min / median) | M=64 ms (min / median) | M=1 GB/s (min) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for k, n in SHAPES:
            ws = {}
            for name in TYPES:
                w = random_quant_weight(Path(folder), name, k, n)
                ws[name] = [w] + [QuantWeight(w.cells.clone(), None, None, w.kind, n, k, name) for _ in range(5)]
            one = timings(ws, torch.randn(1, k).bfloat16(), 300)
            many = timings(ws, torch.randn(64, k).bfloat16(), 30)
            for name, copies in ws.items():
                size = copies[0].nbytes()
                print(f"| {name} | {k}→{n} | {size / 1e6:.1f} MB | {min(one[name]):.3f} / {np.median(one[name]):.3f} | "
                      f"{min(many[name]):.2f} / {np.median(many[name]):.2f} | {size / min(one[name]) / 1e6:.1f} |")
    print(f"# load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
