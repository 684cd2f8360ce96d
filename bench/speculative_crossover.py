"""Where drafting stops paying: the decode step's time against its row count (speculative.max_step_rows).

A drafted question's extra rows are decode rows of the same step (one GEMM per layer over all of them), so a step of
one question with K drafted tokens costs what a step of 1 + K decoding questions costs. This measures that step time
at M rows (M questions decoding, short prompts, the steady decode steps only; median of each M) and prints T(M) / T(1):
a draft of K tokens with acceptance a keeps on average sum(a^i, i=0..K) tokens, and pays while that exceeds
T(1 + K) / T(1). Run: PYTHONPATH=. python bench/speculative_crossover.py [--precision bf16] [--rows 1,2,4,...]
"""
from __future__ import annotations

import argparse
import os
import statistics

import kev


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--rows", default="1,2,4,6,8,12,16,24,32,48,64")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    config = {"core": {"precision": args.precision, "max_context": 512},
              "router": {"max_parallel_queries": max(rows), "channel_pool_size": max(rows), "strategy": "round_robin"}}
    with kev.Engine.from_config(config, background=False) as engine:
        engine.generate(["warm up"], max_tokens=4)
        print(f"load average before: {os.getloadavg()}")
        base = None
        for m in rows:
            before = len(engine.stats.recent)
            engine.generate([f"Count from {i} to {i + 50}." for i in range(m)], max_tokens=args.tokens,
                            ignore_eos=True)
            steps = [r.step_ms for r in list(engine.stats.recent)[before:] if r.num_tokens == m]
            median = statistics.median(steps[2:]) if len(steps) > 4 else statistics.median(steps)
            base = base or median
            print(f"M={m:3d}  step {median:6.1f} ms  T(M)/T(1) {median / base:4.2f}  per row {median / m:5.2f} ms")
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
