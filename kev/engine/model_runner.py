"""ModelRunner: the model, its paged KV cache, and the numerics fingerprint of how it computes."""
from __future__ import annotations

import hashlib
import platform

import torch

from kev.engine.packer import TilePlan
from kev.model.attention import PagedKVLayer
from kev.model.llama import LlamaModel
from kev.model.step_metadata import StepMetadata


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, plan: TilePlan) -> None:
        self.model, self.plan = model, plan
        cfg = model.config
        self.device, self.dtype = model.device, model.dtype
        kv_heads = model.first_blocks()[0].num_kv_heads  # this rank's share under tensor parallelism
        self.caches = [
            PagedKVLayer(num_blocks * block_size, kv_heads, cfg.head_dim, self.dtype, self.device)
            for _ in range(cfg.num_layers)
        ]
        self.fingerprint = numerics_fingerprint(self.dtype, self.device, plan, model.cpu_kernels,
                                                model.weight_numerics())

    @torch.inference_mode()
    def run(self, meta: StepMetadata) -> torch.Tensor:
        """fp32 logits [num_samples, vocab] for meta.sample_rows."""
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
    def kv_bytes_per_token(self) -> int:
        cfg = self.model.config
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize


def numerics_fingerprint(dtype: torch.dtype, device: torch.device, plan: TilePlan, cpu_kernels: bool,
                         weights: str) -> str:
    """A short hash of everything that decides the bits of an answer (weights: LlamaModel.weight_numerics, e.g.
    torch.int8 under core.precision int8, the GGUF block formats and the quantized kernel's path under gguf)."""
    device_kind = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    attention = "kernels=kev-cpu" if cpu_kernels else "kernels=torch,attn=sdpa-per-channel"
    if device.type == "cuda":
        attention += ",sdpa=efficient|math"  # model/attention.py: flash and cuDNN are not deterministic there
    parts = [str(dtype), device.type, device_kind, plan.label, attention, torch.__version__,
             f"threads={torch.get_num_threads()}"] + ([f"weights={weights}"] if weights != str(dtype) else [])
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
