"""Distributed vs single mode, one seeded run, one table: `python bench/distributed_bench.py [--out FILE]`.

1. Added latency: the same requests (1 and 8 questions, greedy, 8 tokens), one at a time, to a
   single-mode `kev serve` and to a cluster with one worker (same engine, same threads), p50/p99.
2. Throughput: a fixed batch (32 questions x 16 tokens, 4 concurrent requests) on 1 worker
   (2 threads) and on 2 workers (1 thread each): same cores, split two ways.
3. Recovery: 16 questions x 32 tokens on 2 workers; SIGKILL one while it holds questions;
   time until every answer is in, against the same batch with no kill.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from kev.results.load_report import percentile
from kev.distributed.nats_server import NatsServer, free_port

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [f"Question {i}: name something that is {c}." for i, c in enumerate(
    ["red", "blue", "green", "small", "large", "fast", "slow", "warm"] * 4)]


class Procs:
    def __init__(self, workdir: Path) -> None:
        self.workdir, self.procs = workdir, {}  # type: ignore[var-annotated]

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with (self.workdir / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "kev.cli.main", *args], cwd=REPO, env=env,
                                                stdout=log, stderr=subprocess.STDOUT)
        return self.procs[name]

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    def stop_all(self) -> None:
        for name in [n for n in self.procs if n.startswith("router")]:
            self.stop(name)
        for name in [n for n in self.procs if n.startswith("worker")]:
            self.stop(name)
        for name in list(self.procs):
            self.stop(name)


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"kev": config}))
    return path


def wait_ready(url: str, workers: int = 0, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            channels = httpx.get(f"{url}/v1/channels", timeout=2)
            if channels.status_code == 200 and len({c.get("worker") for c in channels.json()["channels"]} - {None}) >= workers:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready")


def latencies(urls: dict[str, str], n_questions: int, reps: int) -> dict[str, list[float]]:
    """Alternating between the deployments, so a noisy neighbour on the machine hits both alike."""
    out: dict[str, list[float]] = {name: [] for name in urls}
    body = {"queries": QUESTIONS[:n_questions], "max_tokens": 8}
    clients = {name: httpx.Client(base_url=url, timeout=300) for name, url in urls.items()}
    for client in clients.values():
        client.post("/v1/query", json=body)  # warm-up
    for _ in range(reps):
        for name, client in clients.items():
            started = time.perf_counter()
            response = client.post("/v1/query", json=body)
            out[name].append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200 and all(r["status"] == "ok" for r in response.json()["results"])
    for client in clients.values():
        client.close()
    return out


def throughput(url: str) -> tuple[float, float]:
    """(questions/s, tokens/s) for 32 questions x 16 tokens as 4 concurrent requests of 8."""
    def ask(i: int) -> int:
        with httpx.Client(base_url=url, timeout=600) as client:
            body = {"queries": QUESTIONS[8 * i: 8 * i + 8], "max_tokens": 16}
            return sum(r["completion_tokens"] for r in client.post("/v1/query", json=body).json()["results"])

    ask(0)  # warm-up
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        tokens = sum(pool.map(ask, range(4)))
    seconds = time.perf_counter() - started
    return 32 / seconds, tokens / seconds


def batch_time(url: str, kill: subprocess.Popen[bytes] | None) -> float:
    """Seconds until 16 questions x 32 tokens are all answered; SIGKILL `kill` once it holds questions."""
    with httpx.Client(base_url=url, timeout=600) as client:
        started = time.perf_counter()
        accepted = client.post("/v1/requests", json={"queries": QUESTIONS[:16], "max_tokens": 32}).json()
        killed = kill is None
        while True:
            status = client.get(accepted["location"]).json()
            if status["status"] == "done":
                assert all(r["status"] == "ok" for r in status["results"]) and len(status["results"]) == 16
                return time.perf_counter() - started
            if not killed and any(c["worker"] == "worker1" and c["request_id"] == accepted["request_id"]
                                  for c in client.get("/v1/channels").json()["channels"]):
                kill.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                kill.wait()  # type: ignore[union-attr]
                killed = True
            time.sleep(0.05)


def cluster(procs: Procs, workdir: Path, nats: NatsServer, workers: int, threads: int, extra: dict[str, Any]) -> str:
    config = write_config(workdir / f"cluster{workers}.json", {
        "deploy": {"mode": "distributed", "nats_url": nats.url, "workers": workers, **extra},
        "core": {"threads": threads}, "aggregator": {"timeout_ms": 600_000}})
    procs.start("aggregator", ["aggregator", "--config", str(config)])
    for i in range(workers):
        procs.start(f"worker{i}", ["worker", "--config", str(config), "--partition", str(i), "--id", f"worker{i}"])
    port = free_port()
    procs.start("router", ["serve", "--config", str(config), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, workers)
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(REPO / "bench/results/distributed.md"))
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kev-dist-bench-"))
    procs = Procs(workdir)
    rows: dict[str, Any] = {}
    try:
        port = free_port()
        procs.start("single", ["serve", "--config", str(write_config(workdir / "single.json", {
            "core": {"threads": 2}, "aggregator": {"timeout_ms": 600_000}})), "--port", str(port)])
        single = f"http://127.0.0.1:{port}"
        wait_ready(single)
        for workers, threads in ((1, 2), (2, 1)):
            nats = NatsServer(workdir / f"nats{workers}").start()
            url = cluster(procs, workdir, nats, workers, threads, {"ack_wait_s": 3.0, "heartbeat_s": 0.5})
            if workers == 1:
                side_by_side = {n: latencies({"single": single, "distributed": url}, n, args.reps) for n in (1, 8)}
                rows["single"] = {n: v["single"] for n, v in side_by_side.items()}
                rows["distributed"] = {n: v["distributed"] for n, v in side_by_side.items()}
                rows["single_throughput"] = throughput(single)
                procs.stop("single")
            rows[f"throughput_{workers}"] = throughput(url)
            if workers == 2:
                rows["no_kill_s"] = statistics.median(batch_time(url, None) for _ in range(3))
                rows["kill_s"] = batch_time(url, procs.procs.pop("worker1"))
            procs.stop_all()
            nats.stop()
    finally:
        for name in list(procs.procs):
            procs.procs[name].kill()
    Path(args.out).write_text(report(rows))
    print(Path(args.out).read_text())


def report(rows: dict[str, Any]) -> str:
    def p(values: list[float], q: float) -> str:
        return f"{percentile(values, q):.0f}"

    lines = [
        "# Distributed mode vs single mode (`PYTHONPATH=. python bench/distributed_bench.py`, one run)", "",
        f"Machine: 2 CPU cores, 24 GiB, no GPU; torch 2.13 CPU, fp32; default model (SmolLM2-135M); "
        f"{platform.python_version()}; nats-server on 127.0.0.1. Greedy answers.", "",
        "## Added latency (one request at a time, 8 tokens per question)", "",
        "| questions | single p50 ms | single p99 ms | distributed p50 ms | distributed p99 ms | added p50 ms |",
        "|---|---|---|---|---|---|"]
    for n in (1, 8):
        s, d = rows["single"][n], rows["distributed"][n]
        lines.append(f"| {n} | {p(s, 50)} | {p(s, 99)} | {p(d, 50)} | {p(d, 99)} | "
                     f"{percentile(d, 50) - percentile(s, 50):+.0f} |")
    lines += ["", "Single: `kev serve`, 2 torch threads. Distributed: router + aggregator + 1 worker (2 threads), "
              "same engine, same routing; both up at once and asked in turn. The difference is the queue hops "
              "(router -> JetStream -> worker -> JetStream -> aggregator -> router), one JSON delta per token through "
              "two more processes, and the worker's asyncio loop sharing the GIL and the 2 cores with the engine.", "",
              "## Throughput (32 questions x 16 tokens, 4 concurrent requests of 8)", "",
              "| deployment | questions/s | tokens/s |", "|---|---|---|"]
    for label, key in (("single mode, 2 threads", "single_throughput"), ("1 worker, 2 threads", "throughput_1"),
                       ("2 workers, 1 thread each", "throughput_2")):
        q, t = rows[key]
        lines.append(f"| {label} | {q:.2f} | {t:.1f} |")
    lines += ["", "Both cluster rows share the same 2 cores: a second worker adds no compute here, so the cores, "
              "not Kev, bound it. On machines with one GPU (or a core budget) per worker, workers add capacity. "
              "One worker trails single mode: the router, the aggregator, nats-server and the per-token deltas "
              "take CPU from the same 2 cores, and concurrent requests reach the worker a few ms apart, so they "
              "join its engine at different steps.", "",
              "## Recovery after a worker is killed (16 questions x 32 tokens, 2 workers)", "",
              "| run | seconds until every answer is in |", "|---|---|",
              f"| no kill (median of 3) | {rows['no_kill_s']:.1f} |",
              f"| worker1 SIGKILLed while it holds questions | {rows['kill_s']:.1f} |", "",
              f"Recovery cost: {rows['kill_s'] - rows['no_kill_s']:+.1f} s with deploy.ack_wait_s 3 and heartbeat_s 0.5: "
              "the killed worker's pulled questions come back after ack_wait, its waiting ones as soon as its "
              "heartbeat goes silent (5 periods); the survivor then answers them alone. Every answer arrived once."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
