"""A tensor-parallel follower: `python -m kev.engine.tp_follower FD`, started by rank 0 (kev/engine/tp_runner.py).

FD is this process's end of a socket pair with rank 0. The first message is a FollowerSetup; the
follower loads the model, answers ("ready", None) (or ("error", text) and exits 1), joins the
group, then mirrors rank 0's plans until it says stop or its end of the socket closes (rank 0 gone).
"""
from __future__ import annotations

import logging
import pickle
import sys
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from kev.engine.engine_setup import load_model_and_tokenizer
from kev.engine.model_runner import ModelRunner
from kev.engine.row_tiling import shard_row_tiling
from kev.engine.tp_runner import COLLECTIVE_TIMEOUT_S, HOST, FollowerSetup, meta_to, rank_threads
from kev.model.tensor_parallel import TensorGroup, shard_model


def main(fd: int) -> int:
    conn = Connection(fd)
    setup: FollowerSetup = conn.recv()
    config, device = setup.config, torch.device(setup.device)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s kev-tp{setup.rank} %(levelname)s %(message)s")
    try:
        if (threads := rank_threads(config, device)) is not None:
            torch.set_num_threads(threads)
        rank_config = config.model_copy(update={"core": config.core.model_copy(update={"device": setup.device})})
        model, _ = load_model_and_tokenizer(rank_config)
    except Exception as err:
        conn.send(("error", f"{err!r}\n{traceback.format_exc()}"))
        return 1
    conn.send(("ready", None))
    world = config.core.tensor_parallel
    store = dist.TCPStore(HOST, setup.store_port, world, False, timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    shard = shard_model(model, TensorGroup.connect(store, setup.rank, world, device, COLLECTIVE_TIMEOUT_S))
    del model
    runner = ModelRunner(shard, setup.num_blocks, config.core.block_size, shard_row_tiling(config, shard))
    follow(runner, conn, device)
    return 0


def follow(runner: ModelRunner, conn: Connection, device: torch.device) -> None:
    """Mirror rank 0's plans in order; return when it says stop or is gone (its end of the socket closed)."""
    while True:
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionResetError):
            return
        if kind == "stop":
            return
        if kind == "copy":
            runner.copy_slots(payload)
        else:
            runner.run(meta_to(payload, device))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
