"""Server memory under sustained load (issue 24, point 7): is RSS flat once warm?

Starts `kev serve` on its shipped defaults, runs --clients clients (each a loop of requests: the
Kev API and the OpenAI routes, streamed and not, short and long answers) for --minutes, and reads
the server's RSS every --every seconds. After the warm-up (the first --warmup-minutes), RSS must
stay flat: the last samples at most 5% above the first ones after warm-up.

    python bench/memory_soak.py [--clients 64] [--minutes 20] [--every 30] [--out bench/results/memory_soak.md]

Run it alone on the machine (`flock /tmp/kev-bench.lock python bench/memory_soak.py`); it prints
and writes one table with every sample, the machine and its load.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from served import machine, start_server  # bench/served.py
import psutil

REPO = Path(__file__).resolve().parents[1]
MAX_GROWTH = 0.05
TOPICS = ("the sea", "a cat", "mountains", "rain", "coffee", "trains", "the moon", "a garden", "music", "winter")




def request_for(n: int) -> tuple[str, dict[str, object], bool]:
    """The n-th request of a client: four shapes in turn, varied lengths."""
    topic, max_tokens = TOPICS[n % len(TOPICS)], 4 + (n * 7) % 60
    shape = n % 4
    if shape == 0:
        return "/v1/query", {"queries": [f"Write about {topic}.", f"Name a colour ({n})."], "max_tokens": max_tokens}, False
    if shape == 1:
        return "/v1/query", {"queries": [f"Tell a story about {topic}."], "max_tokens": max_tokens, "stream": True}, True
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": f"Facts about {topic}?"}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": n}
    return "/v1/chat/completions", {**body, "stream": shape == 3}, shape == 3


async def client_loop(http: httpx.AsyncClient, first: int, stop: asyncio.Event, statuses: Counter[int]) -> None:
    for n in itertools.count(first, 64):
        if stop.is_set():
            return
        path, body, stream = request_for(n)
        try:
            if stream:
                async with http.stream("POST", path, json=body) as response:
                    async for _ in response.aiter_bytes():
                        pass
            else:
                response = await http.post(path, json=body)
            statuses[response.status_code] += 1
        except httpx.HTTPError:
            statuses[0] += 1


async def soak(port: int, pid: int, clients: int, seconds: float, every: float) -> tuple[list[tuple[float, float]],
                                                                                        Counter[int]]:
    process, stop, statuses = psutil.Process(pid), asyncio.Event(), Counter[int]()
    samples = [(0.0, process.memory_info().rss / 2**20)]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600,
                                 limits=httpx.Limits(max_connections=clients)) as http:
        tasks = [asyncio.create_task(client_loop(http, i, stop, statuses)) for i in range(clients)]
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            await asyncio.sleep(min(every, seconds - elapsed))
            samples.append((time.monotonic() - started, process.memory_info().rss / 2**20))
            print(f"{samples[-1][0]:7.0f} s  RSS {samples[-1][1]:7.1f} MiB  answered {dict(statuses)}", flush=True)
        stop.set()
        await asyncio.gather(*tasks)
    return samples, statuses


def verdict(samples: list[tuple[float, float]], warmup_s: float) -> tuple[float, float, float]:
    """(RSS just after warm-up, RSS at the end, growth): medians of three samples at each end."""
    warm = [rss for at, rss in samples if at >= warmup_s]
    if len(warm) < 2:
        raise SystemExit("too few samples after the warm-up: run longer or sample more often")
    first, last = statistics.median(warm[:3]), statistics.median(warm[-3:])
    return first, last, (last - first) / first




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between RSS samples")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/memory_soak.md")
    args = parser.parse_args()
    before = machine()
    with tempfile.TemporaryDirectory() as folder:
        port = 18000 + os.getpid() % 1000
        proc = start_server(port, Path(folder))
        try:
            samples, statuses = asyncio.run(soak(port, proc.pid, args.clients, args.minutes * 60, args.every))
        finally:
            proc.terminate()
            proc.wait(120)
    first, last, growth = verdict(samples, args.warmup_minutes * 60)
    flat = growth <= MAX_GROWTH
    lines = [f"# Server memory under load: {args.clients} clients for {args.minutes:g} min", "",
             f"Machine: {before} at the start; {machine().split('; ')[1]} at the end. `kev serve` on the shipped "
             "defaults, default model.", "",
             f"Answered: {dict(sorted(statuses.items()))} (status: count; 0 = no answer).", "",
             f"After the {args.warmup_minutes:g}-minute warm-up: RSS {first:.0f} MiB -> {last:.0f} MiB, "
             f"growth {growth * 100:+.1f}% ({'flat' if flat else 'NOT flat'}: the bound is {MAX_GROWTH * 100:g}%).", "",
             "| elapsed s | RSS MiB |", "|---|---|", *(f"| {at:.0f} | {rss:.1f} |" for at, rss in samples), "",
             f"Reproduce: `flock /tmp/kev-bench.lock python bench/memory_soak.py --clients {args.clients} "
             f"--minutes {args.minutes:g} --warmup-minutes {args.warmup_minutes:g} --every {args.every:g}`", ""]
    print("\n".join(lines))
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps({"samples": samples, "growth": growth, "flat": flat}))
    return 0 if flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
