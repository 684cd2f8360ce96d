"""Sharing one `kev serve` (issue 36): tenant B runs batches while tenant A sends one short /v1/query every few
seconds. A's time to first token (submit to the first streamed delta, measured by the client) is taken alone and
then beside B's batches, in the same run on the same server; B's batches must still answer every line once.

    PYTHONPATH=. .venv/bin/python bench/sharing_bench.py --batches 20 --lines 10 --probes 12 --every 3 \
        --out bench/results/sharing.md

Writes a markdown table (the machine line, the load, the command) to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import REPO, free_port, machine, start_server  # noqa: E402

KEYS = {"a": "bench-key-a", "b": "bench-key-b"}
TOPICS = ["rivers", "bread", "trains", "owls", "glass", "tides", "maps", "bees", "salt", "clocks"]


def start(folder: Path, port: int) -> subprocess.Popen[bytes]:
    config = {"kev": {"server": {"api_keys": KEYS}, "router": {"default_timeout_ms": 600_000},
                      "batch": {"dir": str(folder / "batches")}}}
    (folder / "kev.yaml").write_text(json.dumps(config))
    return start_server(port, folder, ("--config", str(folder / "kev.yaml"), "--no-access-log"), ("KEV_API_KEY",))


def ttft(client: httpx.Client, i: int) -> float:
    body = {"queries": [f"Name one fact about {TOPICS[i % 10]}."], "max_tokens": 8, "stream": True}
    started = time.perf_counter()
    with client.stream("POST", "/v1/query", json=body) as response:
        lines = response.iter_lines()
        for line in lines:
            if line == "event: delta":
                first = time.perf_counter() - started
                for _ in lines:  # the rest of the answer
                    pass
                return first
    raise RuntimeError(f"no delta in the answer ({response.status_code})")


def probes(client: httpx.Client, count: int, every: float) -> list[float]:
    times = []
    for i in range(count):
        started = time.monotonic()
        times.append(ttft(client, i))
        time.sleep(max(0.0, every - (time.monotonic() - started)))
    return times


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def run_batches(client: httpx.Client, batches: int, lines: int, folder: Path) -> list[str]:
    ids = []
    for k in range(batches):
        rows = [{"custom_id": f"b{k}-{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "smollm2-135m-instruct", "max_tokens": 24, "temperature": 0,
                          "messages": [{"role": "user", "content": f"Write two lines about {TOPICS[i % 10]} #{k}."}]}}
                for i in range(lines)]
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        file_id = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data)}).json()["id"]
        ids.append(client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}).json()["id"])
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--lines", type=int, default=10)
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between A's queries")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "sharing.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, port = Path(tmp), free_port()
        proc = start(folder, port)
        url = f"http://127.0.0.1:{port}"
        try:
            a = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['a']}"}, timeout=900)
            b = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS['b']}"}, timeout=900)
            ttft(a, 0)  # warm-up
            alone = probes(a, args.probes, args.every)
            load_alone = machine()
            ids = run_batches(b, args.batches, args.lines, folder)
            shared: list[float] = []
            prober = threading.Thread(target=lambda: shared.extend(probes(a, args.probes, args.every)))
            prober.start()
            prober.join()
            load_shared = machine()
            deadline = time.monotonic() + 3600
            while True:
                states = [b.get(f"/v1/batches/{i}").json() for i in ids]
                if all(s["status"] in ("completed", "failed", "cancelled") for s in states):
                    break
                assert time.monotonic() < deadline, "B's batches did not finish within an hour"
                time.sleep(1)
            answered = [line for s in states if s.get("output_file_id")
                        for line in b.get(f"/v1/files/{s['output_file_id']}/content").text.splitlines()]
            custom = [json.loads(line)["custom_id"] for line in answered]
            every_once = sorted(custom) == sorted(f"b{k}-{i}" for k in range(args.batches) for i in range(args.lines))
        finally:
            proc.terminate()
            proc.wait(60)
    row = (f"| A alone | {statistics.median(alone) * 1000:.0f} | {p99(alone) * 1000:.0f} | - |\n"
           f"| A beside B's {args.batches} batches x {args.lines} lines | {statistics.median(shared) * 1000:.0f} | "
           f"{p99(shared) * 1000:.0f} | {'yes' if every_once else 'NO'} ({len(custom)} lines, "
           f"{sum(s['status'] == 'completed' for s in states)}/{args.batches} batches completed) |\n")
    ratio = statistics.median(shared) / statistics.median(alone), p99(shared) / p99(alone)
    text = (f"# Sharing: tenant A's time to first token beside tenant B's batches\n\n"
            f"`{' '.join(['PYTHONPATH=. .venv/bin/python', *sys.argv])}`\n\n"
            f"Machine (alone): {load_alone}  \nMachine (shared): {load_shared}\n\n"
            f"| A's /v1/query (max_tokens 8, streamed) | median TTFT ms | p99 TTFT ms | B: every line answered once |\n"
            f"|---|---|---|---|\n{row}\n"
            f"Median ratio {ratio[0]:.2f}x, p99 ratio {ratio[1]:.2f}x (default sharing: batch_share 0.5, "
            f"batch_reserve 1).\n")
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
