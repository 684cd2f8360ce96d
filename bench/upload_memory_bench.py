"""Server memory during concurrent uploads: four 200 MB files at once to a real `kev serve` (issue 30: RSS must move
by less than 100 MB; before uploads streamed to disk, one 200 MB file took ~800 MB and four ~2.5 GB).

The server's peak resident memory is the kernel's high-water mark (VmHWM), reset just before the uploads
(`echo 5 > /proc/PID/clear_refs`, so the model load's peak does not count; needs the process's owner); the figure is
that peak minus the resident memory before. /health is timed meanwhile (the event loop must stay free).

    python bench/upload_memory_bench.py [--uploads 4] [--mib 200] [--repo PATH] [--out bench/results/upload_memory.md]

--repo: the Kev checkout the server runs from (default: this one), e.g. an older one to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key"
LINE = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def memory_mib(pid: int, field: str = "VmRSS") -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def start_server(workdir: Path, repo: Path) -> tuple[subprocess.Popen[bytes], str]:
    # kernels: torch: uploads never reach the model, and an older checkout then needs no C++ kernel build
    config = {"kev": {"batch": {"dir": str(workdir / "batches")}, "core": {"kernels": "torch"}}}
    (workdir / "kev.yaml").write_text(json.dumps(config))
    log_path = workdir / "server.log"
    env = {**os.environ, "PYTHONPATH": str(repo), "KEV_API_KEY": KEY, "TMPDIR": str(workdir)}
    proc = subprocess.Popen([sys.executable, "-m", "kev.cli.main", "serve", "--config", str(workdir / "kev.yaml"),
                             "--port", "0"], env=env, cwd=repo,  # python -m imports from the cwd first
                            stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if found := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", log_path.read_text()):
            try:
                if httpx.get(f"{found.group(1)}/readyz", headers=auth(), timeout=5).status_code == 200:
                    return proc, found.group(1)
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("kev serve did not become ready:\n" + log_path.read_text()[-2000:])


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def upload(url: str, path: Path, statuses: list[int]) -> None:
    with path.open("rb") as data:  # httpx reads a file object in chunks: the client holds no whole copy either
        response = httpx.post(f"{url}/v1/files", data={"purpose": "batch"}, files={"file": (path.name, data)},
                              headers=auth(), timeout=900)
    statuses.append(response.status_code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uploads", type=int, default=4)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        source = workdir / "input.jsonl"
        with source.open("wb") as out:  # just under batch.max_file_bytes (200 MiB)
            out.write(LINE * ((args.mib << 20) // len(LINE) - 1))
        size = source.stat().st_size
        proc, url = start_server(workdir, args.repo)
        try:
            time.sleep(2)
            before = memory_mib(proc.pid)
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
            statuses: list[int] = []
            threads = [threading.Thread(target=upload, args=(url, source, statuses)) for _ in range(args.uploads)]
            health_ms, started = 0.0, time.monotonic()
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads):
                t0 = time.perf_counter()
                httpx.get(f"{url}/health", timeout=60)
                health_ms = max(health_ms, (time.perf_counter() - t0) * 1000)
                time.sleep(0.02)
            elapsed = time.monotonic() - started
            peak = memory_mib(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(60)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (f"# Upload memory: {args.uploads} x {size / 1e6:.0f} MB at once ({when}), Kev at {args.repo}"
            f"\n\nstatuses {sorted(statuses)}; {args.uploads * size / 1e6 / elapsed:.0f} MB/s in all\n"
            f"server RSS before {before:.0f} MiB, peak {peak:.0f} MiB: **+{peak - before:.0f} MiB**\n"
            f"slowest /health while uploading: {health_ms:.0f} ms\n"
            f"load average before/after: {load_before:.1f} / {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
