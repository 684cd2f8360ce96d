"""Load test recipe: N concurrent clients x a few /v1/query requests of mixed question lengths against one server.

Every answer is checked against the same question answered alone (greedy, same max_tokens):
the engine is batch-invariant, so text and token ids must match exactly. Nothing may be
lost or duplicated and nothing may answer 5xx. Bounded: it stops by itself.

    python tests/server/load_driver.py --write bench/results/load_test.md
    python tests/server/load_driver.py --defaults --write bench/results/load_test_defaults.md   # kev.yaml as shipped
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

_PARAGRAPH = ("A key-value cache stores the attention keys and values of tokens already processed, so that each new "
              "token only computes its own projections and attends to the stored ones. ")
QUESTIONS: list[str] = [
    "Hi", "What is 2+2?", "Name a planet.", "解释一下什么是KV Cache",
    "Explain in one sentence what a hash table is.", "Write a haiku about the sea.",
    "What is the capital of Japan, and what is it famous for?", "Kev的隔离通道是如何实现的",
    _PARAGRAPH * 3 + "Summarise the text above in five words.",
    _PARAGRAPH * 5 + "What does the cache store?",
    "Here is a list: apples, pears, plums, cherries, grapes, figs, dates, limes, lemons, melons. Which is the sourest?",
    _PARAGRAPH * 8 + "Is the cache shared between independent questions? Answer briefly.",
]
# Enough capacity for 64 clients; long timeouts so a slow shared CPU never turns answers into placeholders.
SERVER_CONFIG: dict[str, Any] = {"router": {"max_parallel_queries": 16, "channel_pool_size": 32,
                                            "default_timeout_ms": 600_000},
                                 "server": {"max_inflight_requests": 256}}


@dataclass
class LoadReport:
    clients: int
    requests: int = 0
    questions: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    seen: Counter[tuple[str, int]] = field(default_factory=Counter)  # (request_id, index) -> times answered
    expected: int = 0  # questions sent in requests that were answered 200
    load_samples: list[float] = field(default_factory=list)  # 1-minute load average every 5 s
    truncated: int = 0  # answers cut short: status other than ok (timeout, cancelled, error)
    finish_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def lost(self) -> int:
        return self.expected - len(self.seen)

    @property
    def duplicated(self) -> int:
        return sum(count - 1 for count in self.seen.values())

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if ordered else 0.0


async def solo_answers(client: httpx.AsyncClient, max_tokens: int) -> dict[str, dict[str, Any]]:
    """Each question alone in the engine: the reference every loaded answer must equal."""
    answers = {}
    for question in QUESTIONS:
        response = await client.post("/v1/query", json={"queries": [question], "max_tokens": max_tokens})
        response.raise_for_status()
        answers[question] = response.json()["results"][0]
    return answers


async def run_load(client: httpx.AsyncClient, solo: dict[str, dict[str, Any]], clients: int, requests_per_client: int,
                   max_tokens: int, seed: int = 0) -> LoadReport:
    report = LoadReport(clients)

    async def one_client(client_id: int) -> None:
        rng = random.Random(seed * 1000 + client_id)
        for _ in range(requests_per_client):
            questions = rng.sample(QUESTIONS, rng.randint(1, 2))
            started = time.perf_counter()
            response = await client.post("/v1/query", json={"queries": questions, "max_tokens": max_tokens})
            report.latencies_ms.append((time.perf_counter() - started) * 1000)
            report.requests += 1
            report.statuses[response.status_code] += 1
            if response.status_code == 200:
                _check(report, questions, response.json(), solo)

    async def sample_load() -> None:  # other processes on the machine skew every number: record how busy it was
        while True:
            report.load_samples.append(os.getloadavg()[0])
            await asyncio.sleep(5)

    sampler = asyncio.ensure_future(sample_load())
    started = time.perf_counter()
    try:
        await asyncio.gather(*(one_client(i) for i in range(clients)))
    finally:
        sampler.cancel()
    report.wall_s = time.perf_counter() - started
    return report


def _check(report: LoadReport, questions: list[str], body: dict[str, Any], solo: dict[str, dict[str, Any]]) -> None:
    report.expected += len(questions)
    for result in body["results"]:
        report.seen[(result["request_id"], result["index"])] += 1
        if result["request_id"] != body["request_id"] or not 0 <= result["index"] < len(questions):
            report.mismatches.append(f"{body['request_id']}: stray result {result['request_id']}#{result['index']}")
            continue
        report.questions += 1
        report.completion_tokens += result["completion_tokens"]
        report.finish_reasons[result["finish_reason"]] += 1
        report.truncated += result["status"] != "ok"
        reference = solo[questions[result["index"]]]
        if (result["token_ids"], result["text"]) != (reference["token_ids"], reference["text"]):
            report.mismatches.append(f"{body['request_id']}#{result['index']}: {result['text']!r} "
                                     f"!= solo {reference['text']!r}")


async def measure(url: str, headers: dict[str, str], clients: int, requests_per_client: int, max_tokens: int,
                  budget_s: float) -> LoadReport:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=budget_s, limits=limits) as client:
        solo = await solo_answers(client, max_tokens)
        return await asyncio.wait_for(run_load(client, solo, clients, requests_per_client, max_tokens), budget_s)


def machine(precision: str) -> str:
    memory_kib = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")).split()[1])
    return (f"{os.cpu_count()} CPU cores, {memory_kib / 2**20:.0f} GiB RAM, no GPU; "
            f"Python {platform.python_version()}, torch {importlib.metadata.version('torch')} (CPU), {precision}, "
            "default model smollm2-135m-instruct")


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def markdown(report: LoadReport, max_tokens: int, requests_per_client: int, peak_rss_mib: float, cpu_s: float) -> str:
    statuses = ", ".join(f"{code}: {count}" for code, count in sorted(report.statuses.items()))
    rows = [("clients (concurrent)", report.clients),
            ("requests", f"{report.requests} ({requests_per_client} per client, 1-2 questions each)"),
            ("questions answered", report.questions), ("max_tokens (greedy)", max_tokens),
            ("HTTP statuses", statuses), ("lost / duplicated answers", f"{report.lost} / {report.duplicated}"),
            ("answers different from solo", len(report.mismatches)),
            ("answers cut short (timeout / cancelled / error)", report.truncated),
            ("finish reasons", ", ".join(f"{k}: {v}" for k, v in sorted(report.finish_reasons.items()))),
            ("wall time", f"{report.wall_s:.1f} s"),
            ("throughput", f"{report.requests / report.wall_s:.2f} requests/s, {report.questions / report.wall_s:.2f} "
                           f"questions/s, {report.completion_tokens / report.wall_s:.1f} completion tokens/s"),
            ("request latency p50 / p99",
             f"{report.percentile_ms(0.5) / 1000:.2f} s / {report.percentile_ms(0.99) / 1000:.2f} s"),
            ("server peak RSS (VmHWM)", f"{peak_rss_mib:.0f} MiB"),
            ("server CPU time (solo + load phases)", f"{cpu_s:.0f} s ({cpu_s / report.wall_s:.2f} cores)"),
            ("machine 1-min load average (mean / max)",
             f"{sum(report.load_samples) / max(1, len(report.load_samples)):.1f} / "
             f"{max(report.load_samples, default=0):.1f}")]
    lines = ["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    return "\n".join(lines) + "\n"


def main() -> int:
    from harness import ServerProcess  # this folder is on sys.path when run as a script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=3, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--budget", type=float, default=1200.0, help="seconds before the run gives up")
    parser.add_argument("--write", type=Path, help="write the markdown report here")
    parser.add_argument("--defaults", action="store_true", help="serve with the shipped defaults (an empty kev.yaml)")
    args = parser.parse_args()
    config = {} if args.defaults else SERVER_CONFIG
    server = ServerProcess(config, Path(tempfile.mkdtemp(prefix="kev-load-"))).start()
    try:
        cpu_before = server_cpu_s(server.proc.pid)  # type: ignore[union-attr]
        report = asyncio.run(measure(server.url, server.headers, args.clients, args.requests, args.max_tokens,
                                     args.budget))
        cpu = server_cpu_s(server.proc.pid) - cpu_before  # type: ignore[union-attr]
        peak = server.peak_rss_mib()
    finally:
        code = server.terminate()
    table = markdown(report, args.max_tokens, args.requests, peak, cpu)
    from kev.config import load_config

    precision = load_config(config).core.resolved_precision
    text = (f"# kev serve load test\n\nMachine: {machine(precision)}.\n\nRecipe: `python tests/server/load_driver.py "
            f"--clients {args.clients} --requests {args.requests} --max-tokens {args.max_tokens}"
            f"{' --defaults' if args.defaults else ''}` (server config: `{config}`; "
            f"exit code on SIGTERM: {code}).\n\n{table}")
    print(text)
    if args.write:
        args.write.write_text(text)
    return 0 if (not report.mismatches and report.lost == report.duplicated == report.truncated == 0
                 and set(report.statuses) == {200}) else 1


if __name__ == "__main__":
    sys.exit(main())
