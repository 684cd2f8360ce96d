"""The prefix-cache timing attack (vLLM's CVE-2025-46570) against a real `kev serve`, as a second caller would run it.

Alice's requests carry a private ~1,240-token system prompt (a PIN inside) under isolation `loose`. Each round, a
fresh caller B sends exactly Alice's prompt (the right guess) and a decoy of the same length (a wrong guess), in
alternating order, and times its first streamed token; Alice's own repeat is timed too. Alice's repeat is a cache
hit: it is what B's right guess looked like before the cache was keyed by tenant (everything was cached under one
"public" key), so it is the signal the attack needs. B's guess must now look like the decoy.

    python bench/prefix_probe_bench.py [--rounds 20] [--out bench/results/prefix_probe.md]

Prints one table (median TTFT of each kind, B's guess / decoy, and how often B's guess beat the decoy: ~50% means
a coin flip) with the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PUBLIC = "You are a helpful assistant."
FILLER = "Policy clause follows. " * 300
SECRET = f"Internal notes for the support desk. The vault PIN is 4417. {FILLER}"
DECOY = f"Internal notes for the support desk. The vault PIN is 9052. {FILLER}"
QUESTION = [{"role": "user", "content": "Say OK."}]


def start_server(workdir: Path, rounds: int) -> tuple[subprocess.Popen[bytes], str]:
    keys = workdir / "keys"
    keys.write_text("alice key-alice\n" + "".join(f"b{i} key-b{i}\n" for i in range(rounds)))
    keys.chmod(0o600)
    config = {"kev": {"server": {"api_keys_file": str(keys), "operator_key": {"env": "KEV_BENCH_OPERATOR"}},
                      "isolation": {"level": "loose", "kv_cache": "shared_readonly", "system_prompt": PUBLIC},
                      "batch": {"dir": str(workdir / "batches")}}}
    (workdir / "kev.yaml").write_text(json.dumps(config))
    log = (workdir / "server.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(REPO), "KEV_BENCH_OPERATOR": "key-operator"}
    proc = subprocess.Popen([sys.executable, "-m", "kev.cli.main", "serve", "--config", str(workdir / "kev.yaml"),
                             "--port", "0"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if (found := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", (workdir / "server.log").read_text())):
            url = found.group(1)
            try:
                if httpx.get(f"{url}/readyz", headers=auth("key-operator"), timeout=5).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("kev serve did not become ready:\n" + (workdir / "server.log").read_text()[-2000:])


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def ttft_ms(url: str, key: str, system: str) -> float:
    """Client-side: from sending the request to its first streamed token."""
    body = {"queries": [QUESTION], "system": system, "isolation": "loose", "max_tokens": 1, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/query", json=body, headers=auth(key), timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("event: delta") or line.startswith("event: result"):
                return (time.perf_counter() - started) * 1000
    raise RuntimeError("no token came back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        proc, url = start_server(Path(folder), args.rounds)
        try:
            ttft_ms(url, "key-alice", SECRET)  # Alice's prompt, now in the cache (for Alice)
            hits, guesses, decoys = [], [], []
            for i in range(args.rounds):
                key = f"key-b{i}"
                hits.append(ttft_ms(url, "key-alice", SECRET))
                pair = [(guesses, SECRET), (decoys, DECOY)]
                for into, system in pair if i % 2 == 0 else pair[::-1]:
                    into.append(ttft_ms(url, key, system))
            metrics = httpx.get(f"{url}/metrics", headers=auth("key-operator")).text
        finally:
            proc.terminate()
            proc.wait(60)
    b_hits = sum(float(v) for t, v in re.findall(r'kev_prefix_cache_tenant_hits_total\{tenant="(b\d+)"\} (\S+)',
                                                    metrics))
    report(args, hits, guesses, decoys, b_hits)


def report(args: argparse.Namespace, hits: list[float], guesses: list[float], decoys: list[float],
           b_hits: float) -> None:
    wins = sum(g < d for g, d in zip(guesses, decoys))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Prefix-cache timing probe, {args.rounds} rounds ({when})",
             "", f"Machine: {cpu}, {os.cpu_count()} CPUs; load average before/after: {LOAD_BEFORE} / "
             f"{os.getloadavg()[0]:.1f}", "", "| request | median TTFT (ms) | min | max |", "|---|---|---|---|"]
    for name, values in (("Alice's own repeat (a hit: what B's right guess got before)", hits),
                         ("B's right guess (Alice's exact prompt)", guesses), ("B's decoy (same length)", decoys)):
        lines.append(f"| {name} | {statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f} |")
    lines += ["", f"B's right guess / decoy, median: {statistics.median(guesses) / statistics.median(decoys):.2f}; "
                  f"Alice's hit / decoy: {statistics.median(hits) / statistics.median(decoys):.2f}",
              f"Rounds in which B's right guess came back before the decoy: {wins}/{args.rounds} (a coin flip: ~half)",
              f"Prefix-cache hits of the B tenants (operator's /metrics): {b_hits:.0f}", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


LOAD_BEFORE = f"{os.getloadavg()[0]:.1f}"

if __name__ == "__main__":
    main()
