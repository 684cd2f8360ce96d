"""The default model's linear shapes (576 -> 1536, 1536 -> 576) on Kev's quantized-activation kernel at the few-row
counts a decode step has at N = 1 and with drafts (M = 1, 2, 4, 8) and beyond, Q4_1 (the default GGUF's type), Q4_K
and Q6_K: the fastest of 150 calls, in ms, by default 2 threads. The weights stay in cache, so this measures the kernel's own
work and threading, not memory. Compare two trees by running it under each, alternately (a loaded machine's min of
150 is stable to a few percent): `PYTHONPATH=<tree> .venv/bin/python bench/quant_small_rows.py [--threads 1]` (one
thread: the kernel's own arithmetic, the steadiest figure beside other work; GMAC/s printed beside each ms)."""
from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from kev.bench.random_gguf import random_quant_weight
from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root

ROWS = (1, 2, 4, 8, 16, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    threads = parser.parse_args().threads
    torch.set_num_threads(threads)
    load_cpu_kernels(cache_root())
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {threads} threads; "
          "ms (GMAC/s), fastest of 150")
    print("| type | in→out | " + " | ".join(f"M={m}" for m in ROWS) + " |")
    print("|---|---|" + "---|" * len(ROWS))
    with tempfile.TemporaryDirectory() as folder:
        for name in ("Q4_1", "Q4_K", "Q6_K"):
            for k, n in ((576, 1536), (1536, 576)):
                if name != "Q4_1" and k % 256:  # K-quant super-blocks are 256 wide
                    continue
                weight = random_quant_weight(Path(folder), name, k, n)
                cells = []
                for m in ROWS:
                    x = torch.randn(m, k)
                    weight(x)
                    best = float("inf")
                    for _ in range(150):
                        start = time.perf_counter()
                        weight(x)
                        best = min(best, time.perf_counter() - start)
                    cells.append(f"{best * 1e3:.4f} ({m * k * n / best / 1e9:.0f})")
                print(f"| {name} | {k}→{n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
