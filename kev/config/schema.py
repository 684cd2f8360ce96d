"""The typed shape of kev.yaml. Every field has a default, so `{}` is a valid config.

Models are frozen and forbid unknown keys: a typo is an error that names the key.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kev.server.server_config import ServerConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeployConfig(_Section):
    mode: Literal["single", "multi_gpu", "distributed"] = "single"
    workers: int = Field(1, ge=1)


class RouterConfig(_Section):
    strategy: Literal["semantic_hash", "consistent_hash", "round_robin", "length_aware"] = "round_robin"
    max_parallel_queries: int = Field(8, ge=1, le=1024)
    channel_pool_size: int = Field(16, ge=1, le=4096)
    overflow_policy: Literal["wait", "queue", "reject"] = "wait"
    max_queue: int = Field(1024, ge=0)
    default_max_tokens: int = Field(256, ge=1)
    max_tokens_cap: int = Field(4096, ge=1)

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


IsolationLevel = Literal["strict", "shared", "loose"]
ISOLATION_ORDER: dict[str, int] = {"strict": 0, "shared": 1, "loose": 2}


class IsolationConfig(_Section):
    level: IsolationLevel = "strict"
    shared_prefix: bool = True
    kv_cache: Literal["split", "unified", "shared_readonly"] = "split"
    system_prompt: str | None = None


class CoreConfig(_Section):
    model_path: str = "smollm2-135m-instruct"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    max_context: int = Field(4096, ge=16)
    device: str = "auto"
    block_size: int = Field(16, ge=1, le=1024)
    # Prefill chunks end at fixed multiples of prefill_chunk counted from the question's
    # own start, so chunking never depends on what else runs (batch invariance).
    prefill_chunk: int = Field(128, ge=1)
    max_step_tokens: int = Field(512, ge=1)
    # Rows of every linear layer run in tiles of this many (padded): a row's bits then
    # never depend on how many rows share the step.
    linear_tile: int = Field(16, ge=1, le=1024)
    threads: int | None = Field(None, ge=1)
    kv_cache_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _chunk_fits_budget(self) -> CoreConfig:
        if self.prefill_chunk > self.max_step_tokens:
            raise ValueError(
                f"core.prefill_chunk ({self.prefill_chunk}) exceeds core.max_step_tokens ({self.max_step_tokens})"
            )
        return self


class AggregatorConfig(_Section):
    mode: Literal["slot_map", "seq_append", "priority"] = "slot_map"
    timeout_ms: int = Field(10000, ge=1)


class KevConfig(_Section):
    deploy: DeployConfig = DeployConfig()
    router: RouterConfig = RouterConfig()
    isolation: IsolationConfig = IsolationConfig()
    core: CoreConfig = CoreConfig()
    aggregator: AggregatorConfig = AggregatorConfig()
    server: ServerConfig = ServerConfig()
