"""kev cluster up: a whole distributed deployment on this machine, for trying it out.

nats-server (from this venv), one aggregator, --workers workers and one router (`kev serve`,
the same HTTP API as single mode). A process that dies is reported at once and restarted with
back-off. Ctrl-C or SIGTERM stops them all, in order, and exits 0.
`kev cluster status --workdir DIR` lists each process, its state and its restarts.
"""
from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

from kev.errors import KevError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start nats-server, an aggregator, N workers and a router; Ctrl-C stops them")
    up.add_argument("--config", help="kev.yaml for every role (deploy.mode/nats_url/workers are set for you)")
    up.add_argument("--workers", type=int, default=2, help="inference workers (one model each)")
    up.add_argument("--host", default="127.0.0.1", help="the router's address")
    up.add_argument("--port", type=int, default=8765, help="the router's port")
    up.add_argument("--nats-port", type=int, default=0, help="nats-server's port (default: a free one)")
    up.add_argument("--threads", type=int, help="core.threads of each worker (CPU: cores / workers)")
    up.add_argument("--workdir", help="config, logs and JetStream storage (default: a new temporary folder)")
    status = sub.add_parser("status", help="each process of a running `kev cluster up`: state, pid, restarts")
    status.add_argument("--workdir", required=True, help="the folder `kev cluster up` printed")


def run(args: argparse.Namespace) -> int:
    if args.action == "status":
        return _status(Path(args.workdir))
    return _up(args)


def _status(workdir: Path) -> int:
    from kev.distributed.supervisor import STATUS_FILE, read_status, status_table

    if not (workdir / STATUS_FILE).exists():
        raise KevError(f"--workdir: no {STATUS_FILE} in {workdir} (is `kev cluster up --workdir {workdir}` running?)")
    print(status_table(read_status(workdir)))
    return 0


def _up(args: argparse.Namespace) -> int:
    from kev.distributed.cluster import LocalCluster

    if args.workers < 1:
        raise KevError("--workers: at least 1")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kev-cluster-"))
    cluster = LocalCluster(args.config, args.workers, workdir, args.host, args.port, args.nats_port, args.threads)
    stop = {"asked": False}

    def ask_stop(*_: object) -> None:
        stop["asked"] = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, ask_stop)
    try:
        cluster.up()
        assert cluster.nats is not None  # up() started it
        print(f"kev cluster: router {cluster.url}, {args.workers} worker(s), aggregator, NATS {cluster.nats.url}"
              f"\n  logs and config in {workdir}\n  Ctrl-C to stop", flush=True)
        while not stop["asked"]:
            for event in cluster.supervise():
                print(f"kev cluster: {event}", flush=True)
            time.sleep(0.2)
    finally:
        codes = cluster.down()
    print(f"kev cluster: stopped (exit codes {codes})", flush=True)
    return 0
