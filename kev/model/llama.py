"""Kev's decoder for the Llama family (Llama, Mistral, Qwen2-style QKV bias).

Module names follow Hugging Face except for the fused projections (qkv_proj,
gate_up_proj), which halve the number of tiled GEMM calls per layer.
"""
from __future__ import annotations

from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from kev.model.attention import AttentionVariant, PagedKVLayer, attend, layer_variant, paged_attention
from kev.model.triton.ops import DeviceOps
from kev.model.model_config import ModelConfig
from kev.model.rope import RotaryTable
from kev.model.row_invariance import Multiply
from kev.model.step_metadata import StepMetadata
from kev.model.fused_layers import FusedLayers, LayerParts
from kev.model.linear import GemmWeight, Linear
from kev.model.quant_weight import QuantLinear, quant_parts


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps
        self.fused = False  # Kev's C++ row kernel (LlamaModel.use_cpu_kernels)
        self.device_ops: DeviceOps | None = None  # Kev's Triton row kernel (LlamaModel.use_device_kernels)

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None = None) -> torch.Tensor:
        """pending: a layer output not yet added to the residual stream x; added here, in place."""
        if self.device_ops is not None and x.dim() == 2:
            return self.device_ops.add_rms_norm(x, pending, self.weight, self.eps)
        if self.fused:
            if pending is None:
                return torch.ops.kev.rms_norm(x, self.weight, self.eps)
            return torch.ops.kev.add_rms_norm(pending, x, self.weight, self.eps)
        if pending is not None:
            x.add_(pending)
        # fp32 statistics, as Hugging Face does, whatever the model dtype.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, variant: AttentionVariant | None = None) -> None:
        super().__init__()
        self.variant = variant  # a family's sliding window, scale or soft-cap; None: plain causal
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.fused = False  # Kev's C++ kernels: rotary in place, decode attention (LlamaModel.use_cpu_kernels)
        self.device_ops: DeviceOps | None = None  # Triton: rotary + KV write, paged attention (use_device_kernels)
        self.qkv_proj = Linear(cfg.hidden_size, q_size + 2 * kv_size, cfg.attention_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size, False)

    def forward(self, x: torch.Tensor, rope: RotaryTable, meta: StepMetadata, cache: PagedKVLayer) -> torch.Tensor:
        qkv = self.qkv_proj(x, meta.tiles)  # [rows, (heads + 2 kv_heads) * dim]
        if self.device_ops is not None:
            out = self._device_attention(self.device_ops, qkv, rope, meta, cache)
        elif self.fused:  # rotary in place and the new keys/values into the cache: one C++ call
            torch.ops.kev.rope_store_kv_(qkv, cache.kv, rope.cos, rope.sin, meta.positions, meta.token_rows,
                                         meta.slot_mapping, self.num_heads, self.num_kv_heads, self.head_dim)
            q = qkv.narrow(1, 0, self.split_sizes[0]).view(-1, self.num_heads, self.head_dim)
            out = attend(q, cache, meta, True, self.variant)
        else:
            q, k, v = qkv.split(self.split_sizes, dim=-1)
            q = q.view(-1, self.num_heads, self.head_dim)  # [rows, heads, dim]
            k = k.view(-1, self.num_kv_heads, self.head_dim)  # [rows, kv_heads, dim]
            v = v.view(-1, self.num_kv_heads, self.head_dim)
            q, k = rope.apply(q, meta.positions), rope.apply(k, meta.positions)
            out = paged_attention(q, k, v, cache, meta, False, self.variant)
        return self.o_proj(out.flatten(1), meta.tiles)  # [rows, hidden]

    def _device_attention(self, ops: DeviceOps, qkv: torch.Tensor, rope: RotaryTable, meta: StepMetadata,
                          cache: PagedKVLayer) -> torch.Tensor:
        """Rotary with the KV write, then every row over its own channel's blocks: two kernels, reading only
        meta.paged's tensors (no spans, no host values), so the step can be captured in a CUDA graph."""
        assert meta.paged is not None, "the Triton path needs the step's PagedRows (RowTiling.paged)"
        rows = meta.paged.views
        ops.rope_store_kv(qkv, cache.kv, rope.cos, rope.sin, rows.positions, rows.slots, self.num_heads,
                          self.num_kv_heads, self.head_dim)
        q = qkv.narrow(1, 0, self.split_sizes[0]).view(-1, self.num_heads, self.head_dim)
        return ops.paged_attention(q, cache.kv, rows.tables, rows.lengths, rows.block_size, self.head_dim ** -0.5)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, False)
        self.fused = False  # Kev's C++ SiLU·mul (LlamaModel.use_cpu_kernels)
        self.device_ops: DeviceOps | None = None  # Kev's Triton SiLU·mul (LlamaModel.use_device_kernels)

    def forward(self, x: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        gate_up = self.gate_up_proj(x, tiles)
        if self.device_ops is not None:
            return self.down_proj(self.device_ops.gated(gate_up, False), tiles)
        if self.fused:
            return self.down_proj(torch.ops.kev.silu_mul(gate_up), tiles)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up, tiles)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: Attention | None = None, mlp: MLP | None = None) -> None:
        """attention, mlp: a family's own (kev/model/families.py); Llama's by default."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention if attention is not None else Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp if mlp is not None else MLP(cfg)

    def fusion_parts(self) -> LayerParts | None:
        """What the one-call decoder op (fused_layers) computes for this layer, or None where the layer is not
        exactly Llama's: a family's own part (a subclass) or attention variant is never fused."""
        attn, mlp, norms = self.self_attn, self.mlp, (self.input_layernorm, self.post_attention_layernorm)
        if not (type(self) is DecoderLayer and type(attn) is Attention and attn.variant is None
                and type(mlp) is MLP and all(type(norm) is RMSNorm for norm in norms)):
            return None
        return LayerParts(norms[0].weight, norms[1].weight, norms[0].eps,
                          [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj])

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None, rope: RotaryTable, meta: StepMetadata,
                cache: PagedKVLayer) -> torch.Tensor:
        """x: the residual stream, updated in place; pending: the previous layer's MLP output, not yet added
        (each residual add is fused into the norm that follows it). Returns this layer's MLP output."""
        attended = self.self_attn(self.input_layernorm(x, pending), rope, meta, cache)
        return self.mlp(self.post_attention_layernorm(x, attended), meta.tiles)


def _as_one_tile(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, [x.shape[0]])


class ArgmaxHead(Protocol):
    """A head that keeps each row's maximum and argmax exact (kev/model/head_rescoring.py's RescoredHead)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def tensors(self) -> list[torch.Tensor]: ...


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        # The token table [vocab, hidden] as a Linear: lookups read its rows, a tied model's head multiplies by it.
        self.embed_tokens = Linear(cfg.hidden_size, cfg.vocab_size, False)
        self.max_positions = max_positions
        self.layers = nn.ModuleList(self.make_layer(cfg, index) for index in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, False)
        self.rope = self.make_rope()
        self.fused_layers: FusedLayers | None = None  # every layer in one C++ call (after prepack)
        self.smoothing: str | None = None  # w8a8's SmoothQuant fold, by its tag (kev/model/smoothing.py), or None
        # w8a8: the calibration text's tokens (kev/model/smoothing.py) and the two-pass head the engine builds with
        # them where Kev's kernels run (kev/model/head_rescoring.py) for the rows read for their argmax alone
        self.calibration_ids: list[int] | None = None
        self.rescored_head: ArgmaxHead | None = None

    def make_layer(self, cfg: ModelConfig, index: int) -> nn.Module:
        """Layer `index`; other families override this (kev/model/families.py)."""
        return DecoderLayer(cfg, Attention(cfg, layer_variant(cfg, index, self.max_positions)))

    def make_rope(self) -> RotaryTable:
        cfg = self.config
        return RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, self.max_positions, cfg.rotary_dim)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype of activations and K/V (weights may be int8: core.precision int8)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens.rows(input_ids, self.dtype)

    def prepack(self, rows_hint: int, kev_gemm: bool = False) -> None:
        """Pack every linear weight once for the CPU kernel (no-op where none applies); the token table only where
        it is the head too. Kev's GEMM needs the C++ kernels loaded first (use_cpu_kernels)."""
        for module in self.modules():
            if isinstance(module, Linear) and (module is not self.embed_tokens or self.lm_head is None):
                module.prepack(rows_hint, kev_gemm)
        self.fused_layers = FusedLayers.build(self)

    def weight_bytes(self) -> int:
        """Bytes of the weights held: parameters, int8 scales and kernel packings, each storage once (Kev's GEMM
        packing replaces the plain weight). The figure `kev plan` predicts (engine/kv/memory_plan.weight_bytes)."""
        tensors: list[torch.Tensor | None] = list(self.parameters())
        for module in self.modules():
            if isinstance(module, Linear):
                tensors.append(module.scale)
                if isinstance(module.packed, GemmWeight):
                    tensors += [module.packed.packed, module.packed.bias, module.packed.scale]
                if isinstance(module.packed, QuantLinear):
                    tensors += module.packed.tensors()
        if self.rescored_head is not None:
            tensors += self.rescored_head.tensors()
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in tensors if t is not None and t.numel()}
        return sum(storages.values())

    def use_cpu_kernels(self, enabled: bool) -> None:
        """Kev's C++ kernels (model/cpu_kernels) for decode attention, rotary, RMSNorm and SiLU·mul."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.fused = enabled

    def first_blocks(self) -> tuple[Attention, MLP]:
        """The first layer's attention and MLP: every family's layer has both (as `self_attn`, `mlp`)."""
        layer = self.layers[0]
        attention, mlp = layer.self_attn, layer.mlp
        assert isinstance(attention, Attention) and isinstance(mlp, MLP)
        return attention, mlp

    def use_device_kernels(self, ops: DeviceOps | None) -> bool:
        """Kev's Triton kernels (model/triton) for RMSNorm and the gated activations, and rotary + paged attention where
        every layer is plain causal attention (no family variant, full rotary, power-of-two head size). True when
        attention runs them: then a step reads its rows from PagedRows only, and decode can be one CUDA graph."""
        rope_ok = self.rope.rotary_dim is None and self.config.head_dim & (self.config.head_dim - 1) == 0
        attentions = [m for m in self.modules() if isinstance(m, Attention)]
        # all or none: a step whose rows some layer reads through spans keeps every layer on the torch attention
        every_attention = ops is not None and rope_ok and all(
            type(m) is Attention and m.variant is None for m in attentions)
        for module in self.modules():
            if isinstance(module, (RMSNorm, MLP)):
                module.device_ops = ops
        for attention in attentions:
            attention.device_ops = ops if every_attention else None
        return every_attention

    @property
    def device_kernels(self) -> DeviceOps | None:
        return self.first_blocks()[0].device_ops

    @property
    def cpu_kernels(self) -> bool:
        return bool(self.first_blocks()[0].fused)

    def weight_numerics(self) -> str:
        """How linear weights enter the sums: their dtype, and where some are quantized blocks (core.precision
        gguf, w8a8) every block format held and the quantized kernel's instruction-set path."""
        parts = [part for m in self.modules() if isinstance(m, Linear) and isinstance(m.packed, QuantLinear)
                 for part in quant_parts(m.packed)]
        quants, kernels = sorted({p.type_name for p in parts}), sorted({p.kernel for p in parts})
        dtype = str(self.first_blocks()[0].qkv_proj.weight.dtype)
        smoothed = f"~{self.smoothing}" if self.smoothing else ""  # folded weights: other bits than unsmoothed ones
        two_pass = "^head2" if self.rescored_head is not None else ""  # other logits than the plain head's
        return f"{dtype}+{','.join(quants)}@{'+'.join(kernels)}{smoothed}{two_pass}" if quants else dtype

    def kernel_identity(self) -> str:
        """What decides the bits of a linear row: the shapes, the weights' dtype (int8 or the compute dtype) and
        whether weights are prepacked."""
        cfg, head = self.config, self.first_blocks()[0].qkv_proj
        kernel = head.packed.kernel if head.packed is not None else "torch-linear"
        return (f"{cfg.hidden_size}/{cfg.intermediate_size}/{cfg.num_heads}/{cfg.num_kv_heads}/{cfg.vocab_size}/"
                f"{kernel}/{str(head.weight.dtype).removeprefix('torch.')}")

    def row_multiplies(self, max_rows: int, max_samples: int) -> dict[str, tuple[int, Multiply, int]]:
        """Each linear shape as the forward runs it, with the most rows a call can have (for the probe)."""
        attention, mlp = self.first_blocks()
        linears = {"qkv": attention.qkv_proj, "o": attention.o_proj, "gate_up": mlp.gate_up_proj,
                   "down": mlp.down_proj}
        found: dict[str, tuple[int, Multiply, int]] = {
            name: (m.in_features, partial(_as_one_tile, m), max_rows) for name, m in linears.items()}
        found["lm_head"] = (self.config.hidden_size, lambda x: self.logits(x, [x.shape[0]]), max_samples)
        return found

    def forward(self, meta: StepMetadata, caches: list[PagedKVLayer]) -> torch.Tensor:
        """Runs the packed step; returns fp32 logits [num_samples, vocab] for meta.sample_rows only."""
        hidden, rows = self.final_hidden(meta, caches), meta.sample_rows.numel()
        if self.rescored_head is not None and meta.argmax_only is not None:
            return self._argmax_logits(hidden[:rows], meta.argmax_only, self.rescored_head)
        return self.logits(hidden, meta.sample_tiles)[:rows].float()

    def _argmax_logits(self, hidden: torch.Tensor, argmax_only: torch.Tensor, two_pass: ArgmaxHead) -> torch.Tensor:
        """The rows read for their argmax alone from the two-pass head, the others (logprobs, temperature, grammar,
        scored prompts) from the plain head: both give a row's bits from that row alone (Kev's GEMM, no tiles)."""
        if bool(argmax_only.all()):
            return two_pass(hidden)
        out = hidden.new_empty(hidden.shape[0], self.config.vocab_size, dtype=torch.float32)
        fast, whole = argmax_only.nonzero().flatten(), (~argmax_only).nonzero().flatten()
        out[whole] = self.head(hidden[whole], [whole.numel()]).float()
        if fast.numel():
            out[fast] = two_pass(hidden[fast])
        return out

    def final_hidden(self, meta: StepMetadata, caches: list[PagedKVLayer]) -> torch.Tensor:
        """The head's input [sum(meta.sample_tiles), hidden]: meta.sample_rows normed, zero rows padding the tiles."""
        x = self.embed(meta.input_ids)  # [rows, hidden], the residual stream
        fused = self.fused_layers if self.cpu_kernels else None
        pending = fused.run(x, meta, caches, self.rope.cos, self.rope.sin) if fused is not None else None
        if pending is None:
            for layer, cache in zip(self.layers, caches):
                pending = layer(x, pending, self.rope, meta, cache)
        picked = x.index_select(0, meta.sample_rows)  # [samples, hidden]
        if pending is not None:
            picked = picked + pending.index_select(0, meta.sample_rows)
        missing = sum(meta.sample_tiles) - picked.shape[0]
        picked = torch.cat([picked, picked.new_zeros(missing, picked.shape[1])]) if missing else picked
        return self.norm(picked)

    @property
    def head(self) -> Linear:
        return self.lm_head if self.lm_head is not None else self.embed_tokens

    def logits(self, hidden: torch.Tensor, tiles: list[int]) -> torch.Tensor:
        """hidden: [sum(tiles), hidden]."""
        return self.head(hidden, tiles)
