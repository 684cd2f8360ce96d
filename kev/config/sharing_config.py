"""The `sharing:` section of kev.yaml: how callers share one Kev (docs/security.md, "Sharing").

Two work classes: live (the Kev API, the OpenAI routes, `kev run`, a local `kev batch`) and batch (the lines of a
server's /v1/batches). Live comes first; among tenants, parallel slots and queue places go by weighted fair queueing.
It lives with the config, not the engine: loading a config imports neither.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kev.config.server_config import TENANT_NAME

WORK_CLASSES = ("live", "batch")


class SharingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # While live work runs or waits, batch lines hold at most this share of router.max_parallel_queries (rounded up;
    # 0: none at all): the rest go to live work as batch lines finish. A batch line never starts while a live
    # question waits for a slot.
    batch_share: float = Field(0.5, ge=0.0, le=1.0)
    # Slots batch lines leave free even when no live work is there, so a live question arriving starts at once
    # instead of waiting for a batch answer to end (at most max_parallel_queries - 1 are kept).
    batch_reserve: int = Field(1, ge=0)
    # tenant -> weight: a tenant of weight 2 gets twice the slots and queue places of one of weight 1 when both wait
    # (weighted fair queueing). A tenant not named here weighs 1.
    weights: dict[str, float] = {}
    # Per tenant, beside the global limits (server.max_inflight_requests, server.max_retained_results,
    # router.max_queue). None: the global limit times the tenant's weight over the weight of every tenant with a
    # key (so one tenant alone gets the whole of it, and a busy tenant never takes another's share).
    tenant_max_inflight_requests: int | None = Field(None, ge=1)
    tenant_max_retained_results: int | None = Field(None, ge=1)
    tenant_max_queue: int | None = Field(None, ge=0)

    @field_validator("weights")
    @classmethod
    def _weights(cls, weights: dict[str, float]) -> dict[str, float]:
        for name, weight in weights.items():
            if not TENANT_NAME.match(name) and name != "operator":
                raise ValueError(f"sharing.weights: {name!r} is not a tenant name")
            if not weight > 0:
                raise ValueError(f"sharing.weights.{name}: must be a positive number, got {weight}")
        return weights

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def tenant_limit(self, explicit: int | None, total: int, tenant: str, tenants: list[str]) -> int:
        """The tenant's share of a global limit: explicit, else total x its weight / the weight of all tenants."""
        if explicit is not None:
            return min(explicit, total)
        if tenant not in tenants or len(tenants) < 2:
            return total
        return max(1, round(total * self.weight(tenant) / sum(self.weight(t) for t in tenants)))
