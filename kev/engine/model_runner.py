"""ModelRunner: the model, its paged KV cache, and the numerics fingerprint of how it computes."""
from __future__ import annotations

import hashlib
import platform

import torch

from kev.engine.decode_graphs import DecodeGraphs
from kev.engine.packer import RowTiling
from kev.model.attention import PagedKVLayer, prefill_kernel_applies
from kev.model.cpu_kernels import kernels_label
from kev.model.llama import LlamaModel
from kev.model.step_metadata import StepMetadata


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, tiling: RowTiling,
                 device_label: str = "") -> None:
        """device_label: Kev's Triton kernels and linear kernel where they run (DeviceSetup.label), else ""."""
        self.model, self.tiling, self.block_size = model, tiling, block_size
        cfg = model.config
        self.device, self.dtype = model.device, model.dtype
        kv_heads = model.first_blocks()[0].num_kv_heads  # this rank's share under tensor parallelism
        self.caches = [
            PagedKVLayer(num_blocks * block_size, kv_heads, cfg.head_dim, self.dtype, self.device)
            for _ in range(cfg.num_layers)
        ]
        self.fingerprint = numerics_fingerprint(self.dtype, self.device, tiling, model.cpu_kernels,
                                                model.weight_numerics(), device_label)
        self.graphs: DecodeGraphs | None = None

    def use_decode_graphs(self, max_rows: int, max_context: int) -> None:
        """Decode-only steps from now on run over fixed row buckets (engine/decode_graphs.py): each one CUDA-graph
        replay on CUDA; elsewhere (the tests) the same buckets run eagerly."""
        self.graphs = DecodeGraphs(self.model, self.caches, self.tiling, max_rows, max_context, self.block_size)
        if self.device.type == "cuda":
            self.graphs.capture()

    @torch.inference_mode()
    def run(self, meta: StepMetadata) -> torch.Tensor:
        """fp32 logits [num_samples, vocab] for meta.sample_rows."""
        bucket = self.graphs.bucket_for(meta) if self.graphs is not None else None
        if bucket is not None and self.graphs is not None:
            return self.graphs.run(bucket, meta)
        if meta.paged is not None:  # built on the host: the rows reach the device in one copy
            meta = meta.paged.on_device(meta)
        return self.model(meta, self.caches)

    @torch.inference_mode()
    def copy_slots(self, copies: list[tuple[list[int], list[int]]]) -> None:
        """Copy K/V between cache slots in every layer (a shared prefix into a channel's private blocks)."""
        for source, destination in copies:
            src = torch.tensor(source, dtype=torch.long, device=self.device)
            dst = torch.tensor(destination, dtype=torch.long, device=self.device)
            for cache in self.caches:
                cache.copy_slots(src, dst)

    def close(self) -> None:
        """Let go of what the runner started (tensor parallelism's followers); nothing here."""

    @property
    def failure(self) -> str | None:
        """Why the runner can never run again (a tensor-parallel rank is gone); None here."""
        return None

    @property
    def chunk_invariant(self) -> bool:
        """A prompt row's bits depend neither on how its prompt is chunked nor on the step's other rows: one GEMM per
        step proved row-invariant, and attention on Kev's kernels (soft-capped layers gather per chunk instead).
        Then a shared start computed once is the start each question would compute (engine/shared_starts.py)."""
        return self.tiling.free_rows and self.model.cpu_kernels and self.model.config.attn_logit_softcapping is None

    @property
    def kv_bytes_per_token(self) -> int:
        cfg = self.model.config
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize


def numerics_fingerprint(dtype: torch.dtype, device: torch.device, tiling: RowTiling, cpu_kernels: bool,
                         weights: str, device_label: str = "") -> str:
    """A short hash of everything that decides the bits of an answer (weights: LlamaModel.weight_numerics, e.g.
    torch.int8 under core.precision int8, the GGUF block formats and the quantized kernel's path under gguf;
    device_label: Kev's Triton kernels, the device's linear kernel and its tile probe)."""
    device_kind = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    attention = f"kernels={kernels_label()}" if cpu_kernels else "kernels=torch,attn=sdpa-per-channel"
    if device_label:
        attention = device_label
    else:
        if cpu_kernels and prefill_kernel_applies(dtype, device, 64):
            attention += ",prefill=flash-bf16"  # prompt rows on cpu_kernels/prefill_attention.cpp
        if device.type == "cuda":
            attention += ",sdpa=efficient|math"  # model/attention.py: flash and cuDNN are not deterministic there
    parts = [str(dtype), device.type, device_kind, tiling.label, attention, torch.__version__,
             f"threads={torch.get_num_threads()}"] + ([f"weights={weights}"] if weights != str(dtype) else [])
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
