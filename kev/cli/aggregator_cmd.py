"""kev aggregator: collects the workers' answers, de-duplicates them, times out the late ones,
relays them to the routers.

It loads no model (and no torch). Several may run; they share the work. SIGTERM or Ctrl-C:
finish the answer in hand and exit 0; unacked answers wait in JetStream for the next one.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from typing import TYPE_CHECKING

from kev.cli.logs import add_log_flags
from kev.cli.worker_cmd import add_nats_flag, distributed_config

if TYPE_CHECKING:  # the CLI imports nats-py only for the command that runs
    from kev.distributed.aggregator import Aggregator


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="kev.yaml (deploy.mode distributed)")
    add_nats_flag(parser)
    parser.add_argument("--id", dest="aggregator_id", help="its name in logs (default: a<host>-<pid>)")
    add_log_flags(parser)


def run(args: argparse.Namespace) -> int:
    from kev.distributed.aggregator import Aggregator

    config = distributed_config(args)
    aggregator_id = args.aggregator_id or f"a-{socket.gethostname()}-{os.getpid()}"
    asyncio.run(_serve(Aggregator(config, aggregator_id)))
    return 0


async def _serve(aggregator: Aggregator) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, aggregator.stopping.set)
    await aggregator.run()
