"""core.tensor_parallel: N: rank 0's runner and the followers it starts.

Rank 0 is the engine's own process and does everything it always does (schedule, pack, sample, audit);
its runner sends each step's plan (the slot copies, then the StepMetadata) to every follower over a
socket, then runs its own shard of the forward. A follower is a process Kev starts
(`python -m kev.engine.tp_follower`, so nothing of the caller's __main__ is re-imported): it loads the
same model, keeps its shard (kev/model/tensor_parallel.py) and its share of the KV cache, and mirrors
run/copy_slots in plan order; the ranks meet in the two sums of every layer.

Failure never hangs: a follower that is gone is seen before a plan is sent (its process has an exit
code, or its pipe is broken) or in the next collective (gloo raises when a peer's socket closes, any
collective raises after COLLECTIVE_TIMEOUT_S); either way the step raises EngineFailedError, which
the engine turns into failed questions and a stop. A follower whose pipe closes (rank 0 gone) exits.
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kev.config import KevConfig
from kev.engine.model_runner import ModelRunner
from kev.engine.packer import RowTiling
from kev.engine.row_tiling import shard_row_tiling
from kev.errors import EngineFailedError
from kev.model.device import pick_device
from kev.model.llama import LlamaModel
from kev.model.step_metadata import StepMetadata
from kev.model.tensor_parallel import TensorGroup, check_shardable, shard_model

log = logging.getLogger("kev.engine")

COLLECTIVE_TIMEOUT_S = 120.0  # one sum waits at most this long for the other ranks (a rank that hangs)
STARTUP_TIMEOUT_S = 900.0  # a follower loads the model within this
HOST = "127.0.0.1"  # every rank runs on this machine


@dataclass
class Follower:
    rank: int
    process: subprocess.Popen[bytes]
    conn: Connection  # one end of a socket pair; the follower holds the other

    @staticmethod
    def start(rank: int, setup: FollowerSetup) -> Follower:
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the kev package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        with theirs:
            process = subprocess.Popen([sys.executable, "-m", "kev.engine.tp_follower", str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        follower = Follower(rank, process, Connection(ours.detach()))
        follower.conn.send(setup)
        return follower

    def why_gone(self) -> str | None:
        """None while the process runs; else how it ended."""
        code = self.process.poll()
        if code is None:
            return None
        return f"tensor-parallel rank {self.rank} (pid {self.process.pid}) exited with code {code}"


@dataclass(frozen=True)
class FollowerSetup:
    """What a follower needs to become rank `rank` (sent as its first message)."""

    config: KevConfig
    rank: int
    device: str
    num_blocks: int
    store_port: int


class TensorParallelRunner(ModelRunner):
    """Rank 0's ModelRunner: every run/copy_slots is sent to the followers first, then done on this rank's shard."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, tiling: RowTiling,
                 followers: list[Follower]) -> None:
        super().__init__(model, num_blocks, block_size, tiling)
        self.followers = followers
        self.world = len(followers) + 1
        self.fingerprint = hashlib.sha256(f"{self.fingerprint}|tp={self.world}".encode()).hexdigest()[:12]
        self._stop = weakref.finalize(self, stop_followers, followers)

    def run(self, meta: StepMetadata) -> torch.Tensor:
        self._send(("run", meta_to(meta, torch.device("cpu"))))
        try:
            return super().run(meta)
        except Exception as err:  # any failure inside a step leaves the ranks out of step for good
            raise self._failure(err) from err

    def copy_slots(self, copies: list[tuple[list[int], list[int]]]) -> None:
        if copies:
            self._send(("copy", copies))
            super().copy_slots(copies)

    def close(self) -> None:
        self._stop()

    @property
    def failure(self) -> str | None:
        if not self._stop.alive:  # closed: the followers were told to stop
            return None
        return next((why for f in self.followers if (why := f.why_gone()) is not None), None)

    def _send(self, message: tuple[str, Any]) -> None:
        data = pickle.dumps(message)
        for follower in self.followers:
            if (why := follower.why_gone()) is not None:
                raise EngineFailedError(f"{why}; this engine stops (its questions failed)")
            try:
                follower.conn.send_bytes(data)
            except OSError as err:
                raise self._failure(err) from err

    def _failure(self, err: BaseException) -> EngineFailedError:
        """Name the rank that is gone when there is one (a dying process needs a moment to be reaped)."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            gone = [why for f in self.followers if (why := f.why_gone()) is not None]
            if gone:  # the cause; the collective's own complaint (a closed socket) goes to the log only
                log.error("tensor-parallel step failed: %s", err)
                return EngineFailedError(f"{'; '.join(gone)}; this engine stops (its questions failed)")
            time.sleep(0.05)
        return EngineFailedError(f"tensor-parallel step failed, the ranks are out of step; this engine stops "
                                 f"(its questions failed): {err!r}")


def stop_followers(followers: list[Follower]) -> None:
    """Ask each follower to stop, then make sure it has."""
    for follower in followers:
        try:
            follower.conn.send_bytes(pickle.dumps(("stop", None)))
        except OSError:
            pass
    for follower in followers:
        try:
            follower.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            follower.process.kill()
            follower.process.wait(timeout=10)
        follower.conn.close()


def meta_to(meta: StepMetadata, device: torch.device) -> StepMetadata:
    """meta's tensors on `device` (the followers get it on the CPU, pickled, and move it to their own)."""
    spans = [replace(s, kv_slots=s.kv_slots.to(device),
                     attn_mask=None if s.attn_mask is None else s.attn_mask.to(device)) for s in meta.spans]
    return replace(meta, input_ids=meta.input_ids.to(device), positions=meta.positions.to(device),
                   token_rows=meta.token_rows.to(device), slot_mapping=meta.slot_mapping.to(device),
                   sample_rows=meta.sample_rows.to(device), spans=spans)


def rank_devices(config: KevConfig, group: list[str] | None) -> list[torch.device]:
    """Each rank's device: `group` (multi_gpu: one replica's deploy.devices), else core.device, then the next
    CUDA devices; ranks share one CUDA device only when there are not enough (gloo through host memory)."""
    world = config.core.tensor_parallel
    if group is not None:
        return [torch.device(name) for name in group]
    first = pick_device(config.core.device)
    if first.type != "cuda":
        return [first] * world
    start = first.index or 0
    if torch.cuda.device_count() >= start + world:
        return [torch.device("cuda", start + rank) for rank in range(world)]
    log.warning("core.tensor_parallel %d on %s: fewer CUDA devices than ranks, so the ranks share it "
                "(gloo through host memory: a correctness path, not a speed-up)", world, first)
    return [first] * world


def rank_threads(config: KevConfig, device: torch.device) -> int | None:
    """CPU threads per rank: core.threads, else the machine's cores split between the ranks (None: leave as is)."""
    if device.type != "cpu":
        return None
    return config.core.threads or max(1, (os.cpu_count() or 1) // config.core.tensor_parallel)


def start_tensor_parallel(config: KevConfig, model: LlamaModel, num_blocks: int,
                          group: list[str] | None = None) -> TensorParallelRunner:
    """Start ranks 1..N-1, join them, and return rank 0's runner over its shard of `model` (left unchanged)."""
    world = config.core.tensor_parallel
    check_shardable(model, world)
    devices = rank_devices(config, group)
    if (threads := rank_threads(config, devices[0])) is not None:
        torch.set_num_threads(threads)
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    store = dist.TCPStore(HOST, 0, world, True, timeout, wait_for_workers=False)
    followers: list[Follower] = []
    try:
        for rank in range(1, world):
            setup = FollowerSetup(config, rank, str(devices[rank]), num_blocks, store.port)
            followers.append(Follower.start(rank, setup))
        for follower in followers:
            _wait_ready(follower)
        tensor_group = TensorGroup.connect(store, 0, world, devices[0], COLLECTIVE_TIMEOUT_S)
        shard = shard_model(model, tensor_group)
        tiling = shard_row_tiling(config, shard)
        runner = TensorParallelRunner(shard, num_blocks, config.core.block_size, tiling, followers)
    except BaseException:
        stop_followers(followers)
        raise
    log.info("tensor parallel: %d ranks on %s (%s), followers' pids %s", world, ",".join(map(str, devices)),
             tensor_group.backend, [f.process.pid for f in followers])
    return runner


def _wait_ready(follower: Follower) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not follower.conn.poll(0.2):
        if (why := follower.why_gone()) is not None:
            raise EngineFailedError(f"{why} while loading the model")
        if time.monotonic() > deadline:
            raise EngineFailedError(f"tensor-parallel rank {follower.rank} did not load the model in "
                                    f"{STARTUP_TIMEOUT_S:.0f} s")
    status, detail = follower.conn.recv()
    if status != "ready":
        raise EngineFailedError(f"tensor-parallel rank {follower.rank} failed to start: {detail}")
