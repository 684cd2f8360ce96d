"""MemoryPlan: the memory bill of a deployment: weights + KV per channel, by isolation level and KV mode.

Pure integer arithmetic (no torch), so `kev plan` can price a 70B model on a laptop.

KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per value. The
article's formula puts hidden_size where kv_heads x head_dim belongs: the two agree only
without grouped-query attention (kv_heads == heads); with GQA the article overstates KV
by heads / kv_heads.

Block rounding mirrors the engine: a channel holds ceil(tokens / block_size) blocks, and the
engine's pool is sized in whole blocks (see kv_pool_blocks, which must match engine_setup).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kev.config import KevConfig
    from kev.model.model_config import ModelConfig

# gguf: an upper bound (Q8_0 blocks, 34 bytes per 32 weights, rounded up); Q4 blocks take about 0.6 byte.
WEIGHT_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "w8a8": 1, "gguf": 2}
# Bytes of one K/V or activation value, by the activation dtype (CoreConfig.activation_precision: int8, w8a8 and
# gguf quantise weights only, their K/V are 16-bit, or fp32 on a CPU without native bf16).
KV_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

# The headroom rule: keep free one step's activations (estimated from the shapes) plus 10% of the
# device (at least 1 GiB) for temporaries, allocator fragmentation and the framework's own use.
HEADROOM_FRACTION = 0.10
HEADROOM_MIN_BYTES = 2**30


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: int | None = None  # None: weights unknown (no --params, no vocab/intermediate)
    vocab_size: int | None = None
    intermediate_size: int | None = None
    source: str = ""  # where the shapes came from, for the printout
    linear_params: int | None = None  # int8: the part of num_params stored as int8 (None: all of it)
    linear_outputs: int | None = None  # int8: one fp32 scale per linear output channel


@dataclass(frozen=True)
class PlanInputs:
    shape: ModelShape
    precision: str
    kv_precision: str  # the dtype of K/V and activations (CoreConfig.activation_precision)
    max_context: int
    block_size: int
    channels: int  # router.max_parallel_queries: channels in one forward
    pool_size: int  # router.channel_pool_size: unified reserves blocks for every pooled channel
    kv_cache: str  # the config's mode: decides what the engine allocates at start-up
    typical_tokens: int  # a channel's own tokens (question + answer) beyond the prefix
    prefix_tokens: int  # the declared shared prefix (system prompt), in tokens
    max_step_tokens: int = 512
    kv_cache_tokens: int | None = None  # core.kv_cache_tokens: split pool size override
    device_memory: int | None = None


@dataclass(frozen=True)
class LevelCost:
    level: str
    kv_cache: str
    channels: int  # the number of channels the totals are for
    shared_bytes: int  # held once, whatever the number of channels (the shared prefix)
    per_channel_max_bytes: int  # one channel at max_context (private blocks only)
    per_channel_typical_bytes: int  # one channel at prefix + typical_tokens
    total_max_bytes: int
    total_typical_bytes: int
    channels_that_fit: int | None  # at max_context, beside the weights and the headroom
    channels_that_fit_typical: int | None  # at the typical length (split: set kv_cache_tokens to use them)
    note: str


@dataclass(frozen=True)
class MemoryPlan:
    inputs: PlanInputs
    weights_bytes: int | None
    kv_bytes_per_token: int
    kv_bytes_per_token_article: int
    kv_bytes: int  # GQA formula: every channel at max_context
    kv_bytes_article: int  # the article's formula for the same
    pool_bytes: int  # what the engine allocates at start-up for the config's kv_cache mode
    activation_bytes: int
    headroom_bytes: int | None
    levels: list[LevelCost] = field(default_factory=list)
    channels_that_fit: int | None = None  # strict channels at max_context that fit the device
    fits: bool | None = None  # weights + pool + headroom <= device memory

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        inputs = data.pop("inputs")
        shape = inputs.pop("shape")
        return {**shape, **inputs, **data, "headroom_rule": HEADROOM_RULE}


HEADROOM_RULE = (f"headroom = one step's activations + {HEADROOM_FRACTION:.0%} of device memory "
                 f"(at least {HEADROOM_MIN_BYTES // 2**30} GiB)")


def shape_of(cfg: ModelConfig, source: str = "") -> ModelShape:
    return ModelShape(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_params,
                      cfg.vocab_size, cfg.intermediate_size, source, cfg.linear_params, cfg.linear_outputs)


def weight_bytes(s: ModelShape, precision: str, kv_precision: str) -> int | None:
    """What the engine holds for the weights (LlamaModel.weight_bytes). int8: linear weights one byte each plus an
    fp32 scale per output channel, norms in the compute dtype, kv_precision (output widths are taken as multiples of
    16, the packing's blocks)."""
    if s.num_params is None:
        return None
    if precision in ("int8", "w8a8") and s.linear_params is not None and s.linear_outputs is not None:
        held = s.linear_params + 4 * s.linear_outputs + KV_BYTES[kv_precision] * (s.num_params - s.linear_params)
        return held + (two_pass_head_bytes(s) if precision == "w8a8" else 0)
    return s.num_params * WEIGHT_BYTES[precision]


def two_pass_head_bytes(s: ModelShape) -> int:
    """w8a8's two-pass head (kev/model/head_rescoring.py, on CPUs whose kernels run it): the head's int8 weights again
    in the w8a8 kernel's cells (K padded to 64), their scales and the error bounds, per logit and per block of 16."""
    if s.vocab_size is None:
        return 0
    blocks = -(-s.vocab_size // 16)
    return blocks * 16 * (-(-s.hidden_size // 64) * 64 + 4) + 8 * blocks + 8 * s.vocab_size


def inputs_for(config: KevConfig, shape: ModelShape, typical_tokens: int = 512, prefix_tokens: int = 0,
               device_memory: int | None = None) -> PlanInputs:
    """The plan's inputs for a Kev config: the deployment sizes the engine will use."""
    core, router = config.core, config.router
    return PlanInputs(shape=shape, precision=core.resolved_precision,
                      kv_precision=core.activation_precision, max_context=core.max_context,
                      block_size=core.block_size,
                      channels=router.max_parallel_queries, pool_size=router.channel_pool_size,
                      kv_cache=config.isolation.kv_cache, typical_tokens=typical_tokens, prefix_tokens=prefix_tokens,
                      max_step_tokens=core.max_step_tokens, kv_cache_tokens=core.kv_cache_tokens,
                      device_memory=device_memory)


def kv_pool_blocks(kv_cache: str, max_context: int, block_size: int, channels: int, pool_size: int,
                   kv_cache_tokens: int | None) -> int:
    """KV blocks the engine allocates at start-up (the same rule as engine_setup.build_parts)."""
    per_channel = blocks(max_context, block_size)
    if kv_cache == "unified":
        return pool_size * per_channel
    if kv_cache_tokens:
        return blocks(kv_cache_tokens, block_size)
    return channels * per_channel


def gpu_budget_blocks(fraction: float, total_bytes: int, weight_bytes: int, bytes_per_block: int) -> int:
    """vLLM's --gpu-memory-utilization on Kev's pool: the KV blocks that fit in fraction x the device's memory once
    the weights and the step headroom are in (the headroom rule of the memory plan, activations left out: they
    are inside the 10%)."""
    headroom = max(int(total_bytes * HEADROOM_FRACTION), HEADROOM_MIN_BYTES)
    return max(0, int(fraction * total_bytes) - weight_bytes - headroom) // bytes_per_block


def blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def make_plan(p: PlanInputs) -> MemoryPlan:
    s = p.shape
    value_bytes = KV_BYTES[p.kv_precision]
    per_token = 2 * s.num_layers * s.num_kv_heads * s.head_dim * value_bytes
    per_token_article = 2 * s.num_layers * s.hidden_size * value_bytes
    weights = weight_bytes(s, p.precision, p.kv_precision)
    pool_blocks = kv_pool_blocks(p.kv_cache, p.max_context, p.block_size, p.channels, p.pool_size, p.kv_cache_tokens)
    pool = pool_blocks * p.block_size * per_token
    activations = activation_bytes(p)
    headroom, room = None, None
    if p.device_memory is not None:
        headroom = activations + max(int(p.device_memory * HEADROOM_FRACTION), HEADROOM_MIN_BYTES)
        room = None if weights is None else p.device_memory - weights - headroom
    levels = level_costs(p, per_token, room)
    strict = levels[0]
    return MemoryPlan(
        inputs=p, weights_bytes=weights, kv_bytes_per_token=per_token, kv_bytes_per_token_article=per_token_article,
        kv_bytes=per_token * p.max_context * p.channels,
        kv_bytes_article=per_token_article * p.max_context * p.channels,
        pool_bytes=pool, activation_bytes=activations, headroom_bytes=headroom, levels=levels,
        channels_that_fit=strict.channels_that_fit, fits=None if room is None else pool <= room,
    )


def level_costs(p: PlanInputs, per_token: int, room: int | None) -> list[LevelCost]:
    """strict/split, strict/unified, shared and loose (both shared_readonly), in that order."""
    size = p.block_size
    block_bytes = size * per_token
    prefix = min(p.prefix_tokens, p.max_context - 1)
    typical = min(prefix + p.typical_tokens, p.max_context)
    at_max, at_typical = blocks(p.max_context, size), blocks(typical, size)
    # shared: the prefix entry keeps ceil(P / size) blocks; its full blocks are shared read-only,
    # and each channel copies the partial last block privately, then grows its own blocks.
    shared_blocks, full = blocks(prefix, size), prefix // size

    def fit(once: int, per: int) -> int | None:
        return None if room is None or per == 0 else max(0, (room - once * block_bytes) // (per * block_bytes))

    def cost(level: str, mode: str, n: int, once: int, per_max: int, per_typ: int, note: str) -> LevelCost:
        return LevelCost(level, mode, n, once * block_bytes, per_max * block_bytes, per_typ * block_bytes,
                         (once + n * per_max) * block_bytes, (once + n * per_typ) * block_bytes,
                         fit(once, per_max), fit(once, per_typ), note)

    return [
        cost("strict", "split", p.channels, 0, at_max, at_typical,
             "blocks on demand; the prefix is copied into every channel's private blocks"),
        cost("strict", "unified", p.pool_size, 0, at_max, at_max,
             "every pooled channel reserves max_context at start-up, whatever it holds"),
        cost("shared", "shared_readonly", p.channels, shared_blocks, at_max - full, at_typical - full,
             f"the prefix's {full} full blocks stored once, read-only; the rest private"),
        cost("loose", "shared_readonly", p.channels, shared_blocks, at_max - full, at_typical - full,
             "as shared, and the public prefix stays cached across requests"),
    ]


def activation_bytes(p: PlanInputs) -> int:
    """One full step's widest live tensors: residual + normed rows, q/k/v, gate+up, and fp32 logits.

    An estimate (the real peak depends on the kernels); intermediate defaults to 4 x hidden.
    """
    s = p.shape
    intermediate = s.intermediate_size or 4 * s.hidden_size
    row = 2 * s.hidden_size + (s.num_heads + 2 * s.num_kv_heads) * s.head_dim + 2 * intermediate
    logits = p.channels * (s.vocab_size or 0) * 4
    return p.max_step_tokens * row * KV_BYTES[p.kv_precision] + logits


_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(text: str) -> int:
    """'24GiB' -> 24 x 2^30; '24GB' -> 24 x 10^9; '24G' is binary (as nvidia-smi and free print); bare = bytes."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("kmgtib")
    unit = raw[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(f"cannot read {text!r} as a size (e.g. 24GiB, 24GB, 80G, 1e9)")
    value = float(number) * _UNITS[unit]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(value)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,} B"
