"""Paged, per-channel attention: each channel attends over exactly its own keys.

Running each channel over its own key slots (never a length set by other channels)
keeps its reduction shapes identical alone or packed: that is what makes the
answer bit-identical to a solo run, and what makes cross-channel visibility impossible
by construction rather than by masking.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kev.model.model_config import ModelConfig
from kev.model.step_metadata import ChannelSpan, StepMetadata


@dataclass(frozen=True)
class AttentionVariant:
    """What a family changes in one layer's attention; None keeps Llama's choice."""

    scale: float | None = None  # scores scale; None: head_dim ** -0.5
    window: int | None = None  # sliding window: a query sees itself and the window - 1 keys before it
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap): neither SDPA nor the kernel has it


def layer_variant(cfg: ModelConfig, index: int, max_positions: int) -> AttentionVariant | None:
    """None where the layer is plain causal attention, so Llama-shaped layers keep their exact path."""
    window = cfg.layer_windows[index] if cfg.layer_windows else None
    if window is not None and window >= max_positions:
        window = None  # a window as long as the context never hides a key
    scale = cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None
    if window is None and scale is None and cfg.attn_logit_softcapping is None:
        return None
    return AttentionVariant(scale, window, cfg.attn_logit_softcapping)


class PagedKVLayer:
    """One layer's cache: [2 (K, V), num_slots, num_kv_heads, head_dim], so one gather fetches both."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        # empty, not zeros: a slot is read only after its owner wrote it (the span's ctx_len).
        self.kv = torch.empty(2, num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)

    def copy_slots(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        self.kv.index_copy_(1, destination, self.kv.index_select(1, source))


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata, decode_kernel: bool,
    variant: AttentionVariant | None = None,
) -> torch.Tensor:
    """q: [num_rows, heads, dim]; k, v: [num_rows, kv_heads, dim] for the new tokens. Returns [num_rows, heads, dim].

    decode_kernel: Kev's C++ kernels (model/cpu_kernels) read each channel's keys in place, all channels in one
    call: in bf16 (AVX-512 BF16) decode rows take the row kernel and prompt chunks of any length the flash-style
    prefill kernel, otherwise every row takes the row kernel (step_metadata.py says why a row's bits stay its
    own). Without them every channel is gathered and attended with SDPA, one call per channel. variant: see
    AttentionVariant; a window only narrows which keys each row reads, so every row still depends on its own
    channel alone."""
    store_new_kv(k, v, cache, meta)
    return attend(q, cache, meta, decode_kernel, variant)


def store_new_kv(k: torch.Tensor, v: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata) -> None:
    """The step's real tokens' keys and values into their cache slots (torch ops; the C++ path fuses this
    with rotary: rope_store_kv_)."""
    new_kv = torch.stack([k, v]).index_select(1, meta.token_rows)  # [2, num_tokens, kv_heads, dim]
    cache.kv.index_copy_(1, meta.slot_mapping, new_kv)


def attend(q: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata, decode_kernel: bool,
           variant: AttentionVariant | None = None) -> torch.Tensor:
    """q: [num_rows, heads, dim] over keys already in the cache; see paged_attention."""
    out = q.new_empty(q.shape)  # contiguous even where q is a view into the fused qkv rows
    if meta.padding_rows is not None:  # rows no channel owns: zeros, as every row is written below
        out.index_fill_(0, meta.padding_rows, 0)
    if variant is not None:
        _variant_attention(q, cache, meta, decode_kernel, variant, out)
        return out
    if not decode_kernel:
        _spans_sdpa(q, cache, meta.spans, out)
        return out
    scale = q.shape[-1] ** -0.5
    prefill = meta.prefill_batch if prefill_kernel_applies(q.dtype, q.device, q.shape[-1]) else None
    batch = meta.kernel_batch if prefill is None else meta.decode_batch
    if batch is not None:
        torch.ops.kev.paged_attention(q, cache.kv, out, batch.rows, batch.kv_slots, batch.starts, batch.lengths, scale)
    if prefill is not None:
        torch.ops.kev.prefill_attention(q, cache.kv, out, prefill.spans, prefill.kv_slots, scale)
    return out


_PREFILL_KERNEL: list[bool] = []  # whether the loaded kernels have the prefill kernel (asked once)


def prefill_kernel_applies(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """The flash-style prefill kernel takes bf16 queries on a CPU with AVX-512 BF16, head_dim 64 or 128."""
    if dtype != torch.bfloat16 or device.type != "cpu" or head_dim not in (64, 128):
        return False
    if not _PREFILL_KERNEL:
        _PREFILL_KERNEL.append(bool(torch.ops.kev.prefill_attention_supported()))
    return _PREFILL_KERNEL[0]


def _variant_attention(q: torch.Tensor, cache: PagedKVLayer, meta: StepMetadata, decode_kernel: bool,
                       variant: AttentionVariant, out: torch.Tensor) -> None:
    decode_kernel = decode_kernel and variant.softcap is None
    batch = meta.kernel_batch if decode_kernel else None
    spans = [] if decode_kernel else meta.spans
    if variant.window is not None:
        batch = batch.windowed(variant.window) if batch is not None else None
        spans = [windowed_span(span, variant.window) for span in spans]
    if batch is not None:
        scale = variant.scale if variant.scale is not None else q.shape[-1] ** -0.5
        torch.ops.kev.paged_attention(q, cache.kv, out, batch.rows, batch.kv_slots, batch.starts, batch.lengths, scale)
    if variant.softcap is not None:
        _spans_eager(q, cache, spans, out, variant)
    else:
        _spans_sdpa(q, cache, spans, out, variant.scale)


def windowed_span(span: ChannelSpan, window: int) -> ChannelSpan:
    """The span over only the keys some row of it can see: row at position p sees keys (p - window, p]."""
    if span.ctx_len <= window:
        return span  # every key is within the window of every row
    first_row = span.ctx_len - span.q_len  # position of the chunk's first row (keys are in position order)
    first_key = max(0, first_row - window + 1)
    keys = torch.arange(first_key, span.ctx_len, device=span.kv_slots.device)
    rows = torch.arange(first_row, span.ctx_len, device=span.kv_slots.device)[:, None]
    mask = (keys <= rows) & (keys > rows - window)  # [q_len, ctx_len - first_key]
    return replace(span, ctx_len=span.ctx_len - first_key, kv_slots=span.kv_slots[first_key:],
                   attn_mask=None if span.q_len == 1 else mask, is_causal=False,
                   prefix_len=max(0, span.prefix_len - first_key))


def _spans_eager(q: torch.Tensor, cache: PagedKVLayer, spans: list[ChannelSpan], out: torch.Tensor,
                 variant: AttentionVariant) -> None:
    """Soft-capped attention as transformers' eager path computes it, one channel at a time (as _spans_sdpa)."""
    scale = variant.scale if variant.scale is not None else q.shape[-1] ** -0.5
    cap = variant.softcap
    assert cap is not None
    for span in spans:
        rows = slice(span.q_start, span.q_start + span.q_len)
        keys_values = cache.kv.index_select(1, span.kv_slots).transpose(1, 2)  # [2, kv_heads, ctx_len, dim]
        keys_values = keys_values.repeat_interleave(q.shape[1] // keys_values.shape[1], dim=1)  # [2, heads, ctx, dim]
        queries = q[rows].transpose(0, 1)  # [heads, q_len, dim]
        scores = torch.matmul(queries, keys_values[0].transpose(1, 2)) * scale  # [heads, q_len, ctx_len]
        scores = torch.tanh(scores / cap) * cap
        mask = span.attn_mask
        if span.is_causal and span.q_len > 1:
            mask = torch.ones(span.q_len, span.ctx_len, dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[rows] = torch.matmul(probs, keys_values[1]).transpose(0, 1)  # [q_len, heads, dim]


# On CUDA, SDPA's flash and cuDNN kernels are not even run-to-run deterministic: on an H200 the same bf16 question
# alone, asked twice with a 600-token prompt, gave different decode logits 4 times in 6, so packed answers "differed"
# from solo ones. The memory-efficient kernel (math where it does not apply) gave 16/16 packed = solo
# (bench/results/gpu_invariance_h200.md).
_DETERMINISTIC_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _deterministic_sdpa(device: torch.device) -> AbstractContextManager[None]:
    return sdpa_kernel(_DETERMINISTIC_SDPA) if device.type == "cuda" else nullcontext()


def _spans_sdpa(q: torch.Tensor, cache: PagedKVLayer, spans: list[ChannelSpan], out: torch.Tensor,
                scale: float | None = None) -> None:
    """One SDPA call per channel over exactly its own keys: torch's CPU SDPA splits its work by batch size,
    so batching channels (even of equal length) would change their bits."""
    with _deterministic_sdpa(q.device):
        for span in spans:
            rows = slice(span.q_start, span.q_start + span.q_len)
            keys_values = cache.kv.index_select(1, span.kv_slots).transpose(1, 2)  # [2, kv_heads, ctx_len, dim]
            queries = q[rows].transpose(0, 1)  # [heads, q_len, dim]
            o = F.scaled_dot_product_attention(
                queries.unsqueeze(0), keys_values[0:1], keys_values[1:2],
                attn_mask=span.attn_mask, is_causal=span.is_causal, enable_gqa=True, scale=scale,
            )  # [1, heads, q_len, dim]
            out[rows] = o[0].transpose(0, 1)
