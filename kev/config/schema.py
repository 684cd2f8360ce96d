"""The typed shape of kev.yaml. Every field has a default, so `{}` is a valid config.

Models are frozen and forbid unknown keys: a typo is an error that names the key.
"""
from __future__ import annotations

import logging
import re
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kev.config.batch_config import BatchConfig
from kev.config.deploy_config import DeployConfig
from kev.config.precision import activation_precision, pick_precision
from kev.config.precision import describe as describe_precision
from kev.config.server_config import ServerConfig
from kev.config.sharing_config import SharingConfig
from kev.config.speculative_config import SpeculativeConfig

log = logging.getLogger("kev.config")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_FILLER_WORDS = ("嗯", "啊", "呃", "额", "哦", "唔", "那个", "um", "umm", "uh", "uhh", "uhm", "er",
                        "erm", "hmm", "well", "so", "ok", "okay")
DEFAULT_GREETINGS = ("你好", "您好", "你们好", "大家好", "hello", "hi", "hey", "hi there", "hello there",
                     "greetings", "good morning", "good afternoon", "good evening", "dear assistant", "在吗",
                     "在不在", "亲", "亲亲", "客服", "打扰一下", "打扰了", "请问一下", "请问", "想问一下",
                     "我想问一下", "问一下", "麻烦问一下", "麻烦问下", "quick question", "i have a question")


class RouterConfig(_Section):
    strategy: Literal["semantic_hash", "consistent_hash", "round_robin", "length_aware"] = "semantic_hash"
    max_parallel_queries: int = Field(8, ge=1, le=1024)
    channel_pool_size: int = Field(16, ge=1, le=4096)
    # An idle channel always takes a question. A busy one takes it only while fewer than this many
    # wait in its own queue (0: never, so "full" means every channel of the group is busy); when no
    # channel of the question's group can take it, overflow_policy applies.
    channel_queue_depth: int = Field(0, ge=0, le=1_000_000)
    overflow_policy: Literal["wait", "queue", "reject"] = "wait"
    max_queue: int = Field(1024, ge=0)  # the overflow FIFO of policy `queue`
    normalize: bool = True
    filler_words: tuple[str, ...] = DEFAULT_FILLER_WORDS
    greetings: tuple[str, ...] = DEFAULT_GREETINGS
    num_buckets: int = Field(64, ge=1, le=1 << 16)  # SimHash buckets: a power of two (one hyperplane per bit)
    hash_seed: int = 0
    virtual_nodes: int = Field(64, ge=1, le=4096)
    epsilon: float = Field(0.25, gt=0.0, le=100.0)  # bounded loads: no channel above (1+ε)× the mean load
    breaker_threshold: int | None = Field(2, ge=0)  # queue length at which new work goes elsewhere; null = off
    length_tiers: tuple[int, ...] = (256,)  # prompt-token boundaries of length_aware's tiers
    categories: dict[str, tuple[str, ...]] = {}  # name -> regexes, matched before hashing, first match wins
    default_max_tokens: int = Field(256, ge=1)
    max_tokens_cap: int = Field(4096, ge=1)
    # The deadline of a question whose request sets no timeout_ms, counted from when it enters its channel;
    # None (the default): no wall-clock deadline. Was aggregator.timeout_ms (still read, with a warning).
    default_timeout_ms: int | None = Field(None, ge=1)
    timeout_ms_cap: int = Field(600_000, ge=1)

    @model_validator(mode="after")
    def _timeout_under_cap(self) -> RouterConfig:
        if self.default_timeout_ms is not None and self.default_timeout_ms > self.timeout_ms_cap:
            raise ValueError(f"router.default_timeout_ms ({self.default_timeout_ms}) exceeds "
                             f"router.timeout_ms_cap ({self.timeout_ms_cap})")
        return self

    @model_validator(mode="after")
    def _pool_holds_parallel(self) -> RouterConfig:
        if self.channel_pool_size < self.max_parallel_queries:
            raise ValueError(
                f"router.channel_pool_size ({self.channel_pool_size}) must be >= "
                f"router.max_parallel_queries ({self.max_parallel_queries})"
            )
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"router.default_max_tokens ({self.default_max_tokens}) exceeds "
                f"router.max_tokens_cap ({self.max_tokens_cap})"
            )
        return self

    @model_validator(mode="after")
    def _routing_is_consistent(self) -> RouterConfig:
        if self.num_buckets & (self.num_buckets - 1):
            raise ValueError(f"router.num_buckets ({self.num_buckets}) must be a power of two (SimHash bits)")
        if self.breaker_threshold is not None and 0 < self.channel_queue_depth <= self.breaker_threshold:
            raise ValueError(f"router.breaker_threshold ({self.breaker_threshold}) must be below "
                             f"router.channel_queue_depth ({self.channel_queue_depth}), or it never trips")
        if any(t < 1 for t in self.length_tiers) or list(self.length_tiers) != sorted(set(self.length_tiers)):
            raise ValueError(f"router.length_tiers {list(self.length_tiers)} must be ascending positive token counts")
        for name, patterns in self.categories.items():
            if name == "other" or not patterns:
                raise ValueError(f"router.categories.{name}: needs a name other than 'other' and at least one pattern")
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise ValueError(f"router.categories.{name}: bad regex {pattern!r}: {err}") from None
        num_groups = (len(self.categories) + 1 if self.categories else 1) * (
            len(self.length_tiers) + 1 if self.strategy == "length_aware" else 1)
        if num_groups > self.max_parallel_queries:
            key = "router.length_tiers" if self.strategy == "length_aware" else "router.categories"
            raise ValueError(f"{key}: {num_groups} channel groups need at least one parallel slot each, "
                             f"router.max_parallel_queries is {self.max_parallel_queries}")
        return self


IsolationLevel = Literal["strict", "shared", "loose"]
ISOLATION_ORDER: dict[str, int] = {"strict": 0, "shared": 1, "loose": 2}


class IsolationConfig(_Section):
    level: IsolationLevel = "strict"  # the loosest level a request may ask for
    shared_prefix: bool = True  # compute a declared common system prompt once per request
    kv_cache: Literal["split", "unified", "shared_readonly"] = "split"
    system_prompt: str | None = None  # declared by the operator; under loose, cached across requests
    shadow_rate: float = Field(0.0, ge=0.0, le=1.0)  # share of questions re-run alone to verify isolation

    @model_validator(mode="after")
    def _consistent(self) -> IsolationConfig:
        sharing = self.level in ("shared", "loose")
        if sharing and self.kv_cache != "shared_readonly":
            raise ValueError(f"isolation.level={self.level!r} shares prefix blocks read-only, which needs "
                             f"isolation.kv_cache='shared_readonly' (got {self.kv_cache!r})")
        if not sharing and self.kv_cache == "shared_readonly":
            raise ValueError("isolation.kv_cache='shared_readonly' needs isolation.level 'shared' or 'loose' "
                             f"(got {self.level!r}: strict never shares a block)")
        if sharing and not self.shared_prefix:
            raise ValueError(f"isolation.level={self.level!r} needs isolation.shared_prefix: true")
        if self.level == "loose" and not self.system_prompt:
            raise ValueError("isolation.level='loose' reuses only the prefix the operator declares public: "
                             "set isolation.system_prompt (isolation.shared_prefix is true)")
        return self


class AuditConfig(_Section):
    # JSON lines (steps, KV, alerts, one "result" per answer); None keeps the checks but writes nothing
    path: str | None = None
    level: Literal["summary", "full"] = "summary"  # full adds every channel's block ids per step and each answer's text


class CoreConfig(_Section):
    model_path: str = "smollm2-135m-instruct"
    # Overrides the model folder's chat template: a file path, or the Jinja template itself.
    chat_template: str | None = None
    # auto: on a CPU, a .gguf model (the default's alias included) runs gguf, as llama.cpp runs the file's own
    # weights; a Hugging Face folder runs bf16 where the device computes it natively (avx512_bf16 / AMX, CUDA), else
    # fp32. int8: weight-only (int8 weights, one scale per output channel; activations and K/V in bf16 where native,
    # fp32 on a CPU without it, fp16 on CUDA without bf16).
    # w8a8: those int8 weights times per-row int8 activations (model/quant_weight.py). gguf: a .gguf model's own
    # Q8_0 / Q4_0 / Q4_1 blocks times per-row int8 activations (other block types dequantized to bf16).
    precision: Literal["auto", "fp32", "bf16", "fp16", "int8", "w8a8", "gguf"] = "auto"
    max_context: int = Field(4096, ge=16)
    device: str = "auto"
    block_size: int = Field(16, ge=1, le=1024)
    # Prefill chunks end at fixed multiples of prefill_chunk counted from the question's
    # own start, so chunking never depends on what else runs (batch invariance).
    prefill_chunk: int = Field(128, ge=1)
    max_step_tokens: int = Field(512, ge=1)
    # Rows of every linear layer run in fixed-size tiles (padded): a row's bits then never
    # depend on how many rows share the step. Decode rows use linear_tile; the body of a
    # prefill chunk uses prefill_tile (fewer weight reads per row).
    linear_tile: int = Field(16, ge=1, le=1024)
    prefill_tile: int = Field(64, ge=1, le=4096)
    # auto: probe at start-up whether the GEMM kernel gives a row the same bits at every row
    # count (model/row_invariance.py) and then run one GEMM per step; tiles: always fixed tiles.
    row_plan: Literal["auto", "tiles"] = "auto"
    # auto: on the CPU, decode attention, rotary, RMSNorm and SiLU·mul run Kev's C++ kernels (built
    # once into ~/.cache/kev/kernels) when they build; on CUDA, Kev's Triton kernels (kev/model/triton) when
    # triton imports; torch: torch ops only (SDPA per channel). triton: the Triton kernels or a load error
    # (on a CPU only under TRITON_INTERPRET=1: the tests' way to run them).
    kernels: Literal["auto", "torch", "triton"] = "auto"
    # CUDA with Kev's Triton kernels: every decode-only step is one CUDA-graph replay, captured at start-up
    # for each row bucket (multiples of linear_tile up to router.max_parallel_queries); false: eager steps.
    cuda_graphs: bool = True
    # CUDA linear layers: cublas in fixed row tiles (linear_tile / prefill_tile), or Kev's persistent Triton
    # GEMM (one tile config, no split-K: row-invariant at any row count, so one GEMM per step).
    gpu_linear: Literal["cublas", "triton"] = "cublas"
    # false: one GEMM over the whole step (faster, but a row's bits then depend on its
    # neighbours); kept to measure what invariance costs.
    batch_invariant: bool = True
    threads: int | None = Field(None, ge=1)
    kv_cache_tokens: int | None = Field(None, ge=1)
    # vLLM's --gpu-memory-utilization: on a GPU, the share of its memory weights + KV cache may take; the KV cache
    # gets what is left after the weights and the step headroom, at most what the channels need. No effect on a CPU.
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    # Ranks one model is split over (Megatron-style, kev/model/tensor_parallel.py), each a process Kev starts; at most
    # the model's key/value heads. single: on core.device (CUDA: the next devices); multi_gpu: per replica, a group of
    # this many of deploy.devices.
    tensor_parallel: int = Field(1, ge=1, le=64)

    @property
    def resolved_precision(self) -> str:
        """precision with auto resolved for this machine and model: fp32 | bf16 | fp16 | int8 | w8a8 | gguf."""
        return pick_precision(self.precision, self.device, self.model_path, self.tensor_parallel, self.kernels)

    @property
    def precision_choice(self) -> str:
        """The precision and, under auto, why (the start-up banner's `precision_choice`)."""
        return describe_precision(self.precision, self.device, self.model_path, self.tensor_parallel, self.kernels)

    @property
    def activation_precision(self) -> str:
        """The dtype activations and K/V take: fp32 | bf16 | fp16 (quantized weights compute in a float dtype)."""
        return activation_precision(self.resolved_precision, self.device)

    @model_validator(mode="after")
    def _chunk_fits_budget(self) -> CoreConfig:
        if self.prefill_chunk > self.max_step_tokens:
            raise ValueError(
                f"core.prefill_chunk ({self.prefill_chunk}) exceeds core.max_step_tokens ({self.max_step_tokens})"
            )
        return self


class AggregatorConfig(_Section):
    mode: Literal["slot_map", "seq_append", "priority"] = "slot_map"


class KevConfig(_Section):
    deploy: DeployConfig = DeployConfig()
    router: RouterConfig = RouterConfig()
    isolation: IsolationConfig = IsolationConfig()
    core: CoreConfig = CoreConfig()
    aggregator: AggregatorConfig = AggregatorConfig()
    audit: AuditConfig = AuditConfig()
    server: ServerConfig = ServerConfig()
    batch: BatchConfig = BatchConfig()
    sharing: SharingConfig = SharingConfig()
    speculative: SpeculativeConfig = SpeculativeConfig()

    @model_validator(mode="before")
    @classmethod
    def _deprecated_timeout_key(cls, data: Any) -> Any:
        """aggregator.timeout_ms was the per-question deadline in all but name: read as router.default_timeout_ms."""
        aggregator = data.get("aggregator") if isinstance(data, dict) else None
        if not isinstance(aggregator, dict) or "timeout_ms" not in aggregator:
            return data
        router = data.get("router") or {}
        if not isinstance(router, dict) or "default_timeout_ms" in router:
            raise ValueError("aggregator.timeout_ms: deprecated alias of router.default_timeout_ms; "
                             "set only the latter")
        warnings.warn("aggregator.timeout_ms is deprecated: it is the per-question deadline, now "
                      "router.default_timeout_ms", DeprecationWarning, stacklevel=2)
        log.warning("config: aggregator.timeout_ms is deprecated; read as router.default_timeout_ms")
        aggregator = {k: v for k, v in aggregator.items() if k != "timeout_ms"}
        deadline = data["aggregator"]["timeout_ms"]
        return {**data, "aggregator": aggregator, "router": {**router, "default_timeout_ms": deadline}}

    @model_validator(mode="after")
    def _replicas_hold_the_groups(self) -> KevConfig:
        """multi_gpu and distributed route over replicas / partitions, one channel group each at least."""
        router = self.router
        groups = (len(router.categories) + 1 if router.categories else 1) * (
            len(router.length_tiers) + 1 if router.strategy == "length_aware" else 1)
        size = self.core.tensor_parallel
        if size > 1 and self.core.gpu_memory_utilization is not None:
            raise ValueError("core.gpu_memory_utilization (--gpu-memory-utilization): not supported with "
                             "core.tensor_parallel > 1 yet (each rank's KV share is sized by the channels); drop it")
        if self.deploy.mode == "multi_gpu" and len(self.deploy.devices) % size:
            raise ValueError(f"deploy.devices ({len(self.deploy.devices)}) must be a multiple of core.tensor_parallel "
                             f"({size}): each replica is a group of {size} devices")
        slots = {"multi_gpu": len(self.deploy.devices) // size,
                 "distributed": self.deploy.num_partitions}.get(self.deploy.mode)
        if slots is not None and groups > slots:
            key = "deploy.devices" if self.deploy.mode == "multi_gpu" else "deploy.partitions"
            units = "replicas" if self.deploy.mode == "multi_gpu" else "partitions"
            raise ValueError(f"{key}: the router's {groups} channel groups (router.categories x length tiers) "
                             f"need at least {groups} {units}, got {slots}")
        return self
