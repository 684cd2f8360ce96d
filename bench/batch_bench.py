"""Throughput of `kev batch`'s path vs submitting the same requests to the engine directly, one engine, interleaved.

    direct: engine.submit() for every request (the engine's own backpressure: submit blocks
            while the channel queues are full), then engine.wait() for each
    batch:  BatchRunner over the EngineBridge, writing the output file line by line, as
            `kev batch` does (at most max_inflight requests in flight)
Both answer the same greedy requests (identical tokens, checked), so the ratio of completion
tokens per second is the cost of the batch machinery. Each round runs both, back to back, the
order alternating; the ratio quoted is the median over rounds of direct_s / batch_s.

    python bench/batch_bench.py [--requests 96] [--max-tokens 16] [--rounds 3] [--threads N]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import kev
from kev.batch.input_file import read_lines
from kev.batch.local_backend import default_max_inflight
from kev.batch.output_file import OutputFile
from kev.batch.requests import BatchRequest, RequestBuilder, build_all
from kev.batch.runner import BatchRunner
from kev.backend.bridge import EngineBridge
from kev.backend.metrics import ServerMetrics

TOPICS = ("the sea", "a cat", "mountains", "rain", "coffee", "trains", "the moon", "a garden", "music", "winter")


def requests_for(config: kev.KevConfig, count: int, max_tokens: int) -> list[BatchRequest]:
    lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "user", "content": f"Tell me something about {TOPICS[i % 10]} (#{i})."}],
        "max_tokens": max_tokens, "temperature": 0}}) for i in range(count)]
    requests, errors = build_all(read_lines(lines, "jsonl")[0], RequestBuilder.from_config(config))
    assert not errors, errors
    return requests


def direct(engine: kev.Engine, requests: list[BatchRequest]) -> tuple[float, dict[str, Any], int]:
    """Seconds, answers and completion tokens."""
    started = time.perf_counter()
    ids = [engine.submit(r.call.queries, **r.call.options) for r in requests]
    results = {r.custom_id: engine.wait(rid) for r, rid in zip(requests, ids)}
    seconds = time.perf_counter() - started
    for rid in ids:
        engine.forget(rid)
    tokens = sum(x.completion_tokens for answer in results.values() for x in answer)
    return seconds, {key: [x.text for x in answer] for key, answer in results.items()}, tokens


def batch(bridge: EngineBridge, requests: list[BatchRequest], max_inflight: int, out: Path) -> tuple[float, dict[str, Any]]:
    texts: dict[str, Any] = {}

    async def run() -> None:
        writer = OutputFile(out)

        def emit(request: BatchRequest, record: dict[str, Any]) -> None:
            writer.write(record)
            texts[request.custom_id] = [c["message"]["content"] for c in record["response"]["body"]["choices"]]

        await BatchRunner(bridge, "bench", max_inflight).run(requests, emit, asyncio.Event())
        writer.close()

    started = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - started, texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--max-inflight", type=int, help="the batch path's (default: as kev batch)")
    parser.add_argument("--config", help="kev.yaml (default: the defaults, no deadline in practice)")
    args = parser.parse_args()
    overrides: dict[str, Any] = {"aggregator": {"timeout_ms": 600_000}, "router": {"max_tokens_cap": 4096}}
    if args.threads:
        overrides["core"] = {"threads": args.threads}
    config = kev.load_config(args.config, overrides)
    engine = kev.Engine(config)
    bridge = EngineBridge(engine, ServerMetrics(), 64)
    requests = requests_for(config, args.requests, args.max_tokens)
    max_inflight = args.max_inflight or default_max_inflight(config)
    direct(engine, requests[:8])  # warm-up
    tokens = 0
    times: dict[str, list[float]] = {"direct": [], "batch": []}
    with tempfile.TemporaryDirectory() as folder:
        for round_no in range(args.rounds):
            for path in ("direct", "batch") if round_no % 2 == 0 else ("batch", "direct"):  # alternate who goes first
                if path == "direct":
                    seconds, reference, tokens = direct(engine, requests)
                else:
                    seconds, answered = batch(bridge, requests, max_inflight, Path(folder) / f"out{round_no}.jsonl")
                times[path].append(seconds)
            assert answered == reference, "the batch path answered differently"
    engine.close()
    direct_s, batch_s = statistics.median(times["direct"]), statistics.median(times["batch"])
    # The two runs of a round are back to back, so they share the machine's load of the moment: their ratio
    # is the fair one on a busy machine, and the median over rounds the figure to quote.
    pairwise = statistics.median(d / b for d, b in zip(times["direct"], times["batch"]))
    report = {"requests": args.requests, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "max_inflight": max_inflight, "direct_s": times["direct"], "batch_s": times["batch"],
              "ratio_batch_over_direct": round(pairwise, 3),
              "ratio_of_medians": round(direct_s / batch_s, 3), "completion_tokens": tokens,
              "direct_tok_s": round(tokens / direct_s, 2), "batch_tok_s": round(tokens / batch_s, 2),
              "device": str(engine.runner.device), "torch_threads": torch.get_num_threads(),
              "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    print(f"{'path':8} {'median s':>9} {'tok/s':>7}\n{'direct':8} {direct_s:9.2f} {tokens / direct_s:7.2f}\n"
          f"{'batch':8} {batch_s:9.2f} {tokens / batch_s:7.2f}\nratio (batch throughput / direct, median of "
          f"rounds) = {report['ratio_batch_over_direct']}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
