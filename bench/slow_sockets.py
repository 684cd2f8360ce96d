"""Slow sockets against `kev serve` on its shipped defaults (issue 24, point 2).

1,000 sockets from one address (127.0.0.2) open, trickle their request headers a byte a second and
reopen as soon as the server closes them, while 40 normal requests from another address (127.0.0.1)
are sent at once. Before the fix about 600 such sockets filled server.max_connections and every real
request got 503. The same 40 requests are first sent with no flood (the baseline), in the same run.
--flood-address 127.0.0.1 is the one-address case (issue 37: a NAT or a proxy; the per-address cap once refused
every client there): the tricklers and the 40 requests share the address.

    python bench/slow_sockets.py [--sockets 1000] [--requests 40] [--flood-address 127.0.0.2]
                                 [--out bench/results/slow_sockets.md]

Prints one table and writes it (with the machine and its load) to --out.
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from served import free_port, machine, start_server  # bench/served.py

REPO = Path(__file__).resolve().parents[1]
CLIENT_ADDRESS = "127.0.0.1"
HEAD = b"POST /v1/query HTTP/1.1\r\nHost: kev\r\n"


@dataclass
class Flood:
    opened: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # what the server answered before it closed


@dataclass
class Batch:
    statuses: Counter[int]
    seconds: list[float]

    def row(self, label: str) -> str:
        ok = self.statuses.get(200, 0)
        slowest = max(self.seconds) if self.seconds else float("nan")
        median = sorted(self.seconds)[len(self.seconds) // 2] if self.seconds else float("nan")
        others = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()) if code != 200) or "none"
        return f"| {label} | {ok}/{sum(self.statuses.values())} | {median:.2f} | {slowest:.2f} | {others} |"



async def trickle(port: int, flood: Flood, stop: asyncio.Event, address: str) -> None:
    """One socket slot: open, send part of the headers, a byte a second; reopen when the server closes it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
        except OSError:
            flood.outcomes["connect failed"] += 1
            await asyncio.sleep(0.1)
            continue
        flood.opened += 1
        try:
            writer.write(HEAD)
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                except TimeoutError:
                    writer.write(b"X")  # one more byte of a header line that never ends
                    continue
                flood.outcomes[data[9:12].decode(errors="replace") if data else "closed silently"] += 1
                break
        except OSError:
            flood.outcomes["reset"] += 1
        finally:
            writer.close()


async def ask(client: httpx.AsyncClient, i: int) -> tuple[int, float]:
    started = time.monotonic()
    try:
        response = await client.post("/v1/query", json={"queries": [f"Say a word about {i}."], "max_tokens": 8})
        return response.status_code, time.monotonic() - started
    except httpx.HTTPError:
        return 0, time.monotonic() - started


async def requests(port: int, num: int) -> Batch:
    transport = httpx.AsyncHTTPTransport(local_address=CLIENT_ADDRESS)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=300,
                                 limits=httpx.Limits(max_connections=num)) as client:
        answers = await asyncio.gather(*(ask(client, i) for i in range(num)))
    return Batch(Counter(code for code, _ in answers), [s for code, s in answers if code == 200])


async def measure(port: int, num_sockets: int, num_requests: int, address: str) -> tuple[Batch, Batch, Flood, float]:
    baseline = await requests(port, num_requests)
    flood, stop = Flood(), asyncio.Event()
    tricklers = [asyncio.create_task(trickle(port, flood, stop, address)) for _ in range(num_sockets)]
    started = time.monotonic()
    while flood.opened < num_sockets and time.monotonic() - started < 60:  # the flood is up before we ask
        await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)  # and has trickled a while (a bench's warm-up, not a test's wait)
    flooded = await requests(port, num_requests)
    stop.set()
    await asyncio.gather(*tricklers, return_exceptions=True)
    return baseline, flooded, flood, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--flood-address", default="127.0.0.2", help="the tricklers' address (127.0.0.1: the "
                        "requests' own)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/slow_sockets.md")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.sockets * 2 + 256)), hard))
    where = machine()
    with tempfile.TemporaryDirectory() as folder:
        port = free_port()
        proc = start_server(port, Path(folder))
        try:
            baseline, flooded, flood, seconds = asyncio.run(measure(port, args.sockets, args.requests,
                                                                   args.flood_address))
        finally:
            proc.terminate()
            proc.wait(120)
    outcomes = ", ".join(f"{what}: {n}" for what, n in flood.outcomes.most_common())
    table = "\n".join([
        f"# Slow sockets: {args.sockets} trickling sockets from {args.flood_address}, {args.requests} requests from "
        f"{CLIENT_ADDRESS}", "",
        f"Machine: {where}. `kev serve` on the shipped defaults (server.max_connections 512, "
        "max_connections_per_client 256, header_timeout_s 10), default model.", "",
        "| requests | answered 200 | median s | slowest s | other statuses |", "|---|---|---|---|---|",
        baseline.row("alone (baseline)"), flooded.row(f"beside {args.sockets} trickling sockets"), "",
        f"The flood opened {flood.opened} sockets in {seconds:.0f} s (each reopens when closed); how the server "
        f"closed them: {outcomes}.", "",
        f"Reproduce: `python bench/slow_sockets.py --sockets {args.sockets} --requests {args.requests} "
        f"--flood-address {args.flood_address}`", ""])
    print(table)
    args.out.write_text(table)
    return 0 if flooded.statuses.get(200, 0) == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
