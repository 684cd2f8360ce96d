"""kev worker: an inference worker of a cluster (deploy.mode distributed): a full engine fed from NATS JetStream.

SIGTERM or Ctrl-C: stop pulling, let the questions held finish for --grace seconds, hand the
rest back to the queue (they are redelivered at once to other workers), exit 0.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
from typing import TYPE_CHECKING

from kev.cli.common import add_config_flags, config_from_args
from kev.cli.logs import add_log_flags
from kev.config import KevConfig, load_config

if TYPE_CHECKING:  # the CLI imports nats-py only for the command that runs
    from kev.distributed.worker import Worker
from kev.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    add_nats_flag(parser)
    parser.add_argument("--partition", type=int, default=0, help="the work partition it pulls first (0..partitions-1)")
    parser.add_argument("--id", dest="worker_id", help="its name in the cluster (default: w<partition>-<host>-<pid>)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds to finish held questions on SIGTERM")
    add_log_flags(parser)


def add_nats_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", help="deploy.nats_url (implies deploy.mode distributed)")


def distributed_config(args: argparse.Namespace) -> KevConfig:
    """The config with --nats-url applied (and the model flags, for commands that have them)."""
    extra = {"deploy": {"mode": "distributed", "nats_url": args.nats_url}} if args.nats_url else {}
    config = config_from_args(args, extra) if hasattr(args, "model") else load_config(args.config, extra or None)
    if config.deploy.mode != "distributed":
        raise ConfigError(f"kev {args.command} needs deploy.mode distributed and deploy.nats_url (or --nats-url)")
    return config


def run(args: argparse.Namespace) -> int:
    config = distributed_config(args)
    if not 0 <= args.partition < config.deploy.num_partitions:
        raise ConfigError(f"--partition {args.partition}: the cluster has partitions "
                          f"0..{config.deploy.num_partitions - 1} (deploy.partitions, default deploy.workers)")
    default_id = f"w{args.partition}-{socket.gethostname()}-{os.getpid()}"
    worker_id = args.worker_id or re.sub(r"[^A-Za-z0-9_-]", "-", default_id)[:64]
    from kev.distributed.worker import Worker
    from kev.engine.describe import banner
    from kev.engine.engine import Engine

    engine = Engine(config)  # loads the model before joining: a worker pulls only once it can answer
    logging.getLogger("kev.worker").info("worker %s: %s", worker_id, banner(engine.describe()))
    worker = Worker(config, engine, worker_id, args.partition)
    try:
        asyncio.run(_serve(worker, args.grace))
    finally:
        engine.close()
    return 0


async def _serve(worker: Worker, grace: float) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stopping.set)
    await worker.run(grace)
