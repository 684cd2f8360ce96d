"""Decode steps as one CUDA-graph replay each.

A decode-only step (every channel adds one row) is the same computation every time up to its row count, so it is
captured once per row bucket at start-up (multiples of the fixed row tile up to max_parallel_queries) over fixed
buffers: a step then copies its rows in (one host-to-device copy of PagedRows.flat) and replays. Padding rows of a
bucket hold slot -1 and length 0: they write no key and read none, and their logits are dropped. The step function is
the model's own forward over a StepMetadata whose tensors are views of those buffers, so graphed and eager steps run
the very same kernels with the same row tiles: a question's bits do not depend on which one ran it. Sampling, logprobs,
grammar masks and stop checks stay outside the graph (the engine works on the logits as before).

Device-agnostic: without CUDA (or with capture off) the same buckets run the step eagerly, which is how the tests check
on CPU that the step reads no host value and sizes nothing by a tensor's contents (torch.compile fullgraph).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kev.engine.packer import RowTiling
from kev.model.attention import PagedKVLayer
from kev.model.llama import LlamaModel
from kev.model.step_metadata import TABLE, DeviceRows, PagedRows, StepMetadata

log = logging.getLogger("kev.engine")


@dataclass
class Bucket:
    rows: int
    host: torch.Tensor  # [rows * (4 + width)] int64, pinned on CUDA: the staging copy of the step's rows
    buffer: torch.Tensor  # the same on the device: what the captured kernels read
    meta: StepMetadata  # the step's metadata over views of buffer
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the captured step's output [rows, vocab] fp32


def bucket_sizes(tile: int, max_rows: int) -> list[int]:
    """Multiples of the fixed row tile, up to the first that holds max_rows."""
    return list(range(tile, -(-max_rows // tile) * tile + 1, tile))


class DecodeGraphs:
    def __init__(self, model: LlamaModel, caches: list[PagedKVLayer], tiling: RowTiling, max_rows: int,
                 max_context: int, block_size: int) -> None:
        self.model, self.caches, self.tiling = model, caches, tiling
        self.block_size, self.width = block_size, -(-max_context // block_size)
        self.buckets = [self._bucket(rows) for rows in bucket_sizes(tiling.small, max_rows)]
        self.capture_seconds = 0.0
        self.steps_run = 0  # decode steps that ran over a bucket (a graph replay on CUDA)

    def _bucket(self, rows: int) -> Bucket:
        device, pinned = self.model.device, self.model.device.type == "cuda"
        empty = PagedRows(torch.zeros(0, TABLE, dtype=torch.long), self.block_size, device)
        host = empty.flat(rows, self.width)
        host = host.pin_memory() if pinned else host
        buffer = host.to(device)
        views = DeviceRows.over(buffer, rows, self.width, self.block_size)
        arange = torch.arange(rows, device=device)
        tiles = self.tiling.for_step(rows) if self.tiling.is_one_gemm else self.tiling.for_decode(rows)
        meta = StepMetadata(input_ids=views.input_ids, positions=views.positions, tiles=tiles, token_rows=arange,
                            slot_mapping=views.slots, spans=[], sample_rows=arange,
                            sample_tiles=self.tiling.for_samples(rows),
                            paged=PagedRows(empty.host, self.block_size, device, static=views))
        return Bucket(rows, host, buffer, meta)

    def step(self, bucket: Bucket) -> torch.Tensor:
        """The captured function: the model's forward over the bucket's buffers. fp32 logits [rows, vocab]."""
        return self.model(bucket.meta, self.caches)

    @torch.inference_mode()
    def capture(self) -> None:
        """One CUDA graph per bucket (largest first, all in one memory pool); logs how long it took."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels (rows write no keys)
                for _ in range(2):
                    self.step(bucket)
            torch.cuda.current_stream().wait_stream(side)
            bucket.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(bucket.graph, pool=pool):
                bucket.logits = self.step(bucket)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - started
        log.info("decode CUDA graphs: %d buckets (%s rows) captured in %.1f s", len(self.buckets),
                 ",".join(str(b.rows) for b in self.buckets), self.capture_seconds)

    def bucket_for(self, meta: StepMetadata) -> Bucket | None:
        """The bucket that runs this step, or None where it is not decode-only (prefill runs eagerly)."""
        paged, spans = meta.paged, meta.spans
        if paged is None or not spans or meta.sample_rows.numel() != len(spans):
            return None
        if any(s.q_len != 1 or s.q_start != i for i, s in enumerate(spans)):
            return None
        if paged.host.shape[1] - TABLE > self.width:
            return None
        return next((b for b in self.buckets if b.rows >= paged.host.shape[0]), None)

    def run(self, bucket: Bucket, meta: StepMetadata) -> torch.Tensor:
        """fp32 logits [num_samples, vocab] of a decode-only step (bucket_for(meta))."""
        assert meta.paged is not None
        self.steps_run += 1
        bucket.host.copy_(meta.paged.flat(bucket.rows, self.width))
        bucket.buffer.copy_(bucket.host, non_blocking=True)  # the step's one host-to-device copy
        if bucket.graph is not None:
            bucket.graph.replay()
            logits = bucket.logits
        else:
            logits = self.step(bucket)
        assert logits is not None
        return logits[: len(meta.spans)].clone()  # the next replay overwrites the graph's output
