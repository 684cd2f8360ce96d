"""Operations: /healthz (liveness: the process answers, from the first second), /health and /readyz
(readiness: the model is loaded and every service a request needs is up; 503 + Retry-After until then,
as llama.cpp's /health), /v1/channels (live channel table), /v1/stats (recent
engine steps), /metrics (Prometheus). /metrics and /v1/stats span tenants: the operator's alone
(server.operator_key); /v1/channels shows a tenant its own questions' channels, and of the others only how many
channels are busy: no channel id of theirs, nor of an idle channel (the busy ones would be the rest), since which
channel a question takes follows its semantic bucket."""
from __future__ import annotations

import time
from dataclasses import asdict

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from kev.wire.bodies.api_models import ChannelModel, ChannelsResponse, Health, StatsResponse, StepModel
from kev.wire.bodies.errors import ApiError
from kev.server.errors import error_responses
from kev.server.query_params import one_value_each
from kev.server.routes_kev import get_service
from kev.server.service import KevService
from kev.config.tenants import Caller, caller_of

router = APIRouter(tags=["operations"])
MAX_STEPS = 1024  # per answer: a poller asks for what came `since` its last answer


@router.get("/healthz", response_model=Health, summary="The process is up (no API key needed)")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health, "description": "not ready"},
                                                          **error_responses(401)},
            summary="Readiness: the model is loaded and the server takes requests (503 + Retry-After until then)")
async def readyz(service: KevService = Depends(get_service)) -> JSONResponse:
    if service.is_ready:  # a cluster short of a worker is still ready: the detail says so
        notice = service.backend.notice if service.backend is not None else None
        return JSONResponse(Health(status="ready", model=service.model_name, detail=notice).model_dump())
    backend = service.backend
    state = ("draining" if service.is_draining else "failed" if service.load_error else "loading" if backend is None
             else "unavailable")
    detail = service.load_error or (service.not_ready_because() if backend is not None else None)
    return JSONResponse(Health(status=state, model=service.model_name, detail=detail).model_dump(), 503,
                        headers=service.retry_after)


@router.get("/health", response_model=Health, responses={503: {"model": Health, "description": "not ready"},
                                                          **error_responses(401)},
            summary="Readiness, at the path vLLM and llama.cpp users probe: the same answer as /readyz")
async def health(service: KevService = Depends(get_service)) -> JSONResponse:
    return await readyz(service)


@router.get("/v1/channels", response_model=ChannelsResponse, responses=error_responses(401, 503),
            summary="Each channel's state (idle / prefill / decode), its question, tokens so far; queue length")
async def channels(service: KevService = Depends(get_service),
                   caller: Caller = Depends(caller_of)) -> ChannelsResponse:
    states, queue_length = await service.ready_backend().channels()
    num_active = sum(1 for s in states if s["state"] != "idle")
    if caller.is_operator:
        return ChannelsResponse(channels=[ChannelModel(**s) for s in states], queue_length=queue_length,
                                num_active=num_active, num_channels=len(states))
    own = [s for s in states
           if s["state"] != "idle" and service.registry.owner(s.get("request_id") or "") == caller.tenant]
    return ChannelsResponse(channels=[ChannelModel(**s) for s in own], queue_length=queue_length,
                            num_active=num_active, num_channels=len(states),
                            num_busy_other_tenants=num_active - len(own))


def operator_only(request: Request) -> Caller:
    """A route that spans tenants (a dependency): 403 for a tenant's key when server.operator_key is in use."""
    caller = caller_of(request)
    if not caller.is_operator:
        raise ApiError(403, f"{request.url.path}: needs the operator key (server.operator_key); it spans tenants",
                       "Authorization")
    return caller


@router.get("/v1/stats", response_model=StatsResponse, responses=error_responses(401, 403, 422, 503),
            dependencies=[Depends(operator_only), Depends(one_value_each)],
            summary="The engine's own counters and its most recent steps (channels and tokens per forward, step time)")
async def stats(since: float | None = Query(None, description="only steps that ended after this unix time"),
                service: KevService = Depends(get_service)) -> StatsResponse:
    counters = await service.ready_backend().stats()
    recent = [r for r in list(counters.recent)[-MAX_STEPS:] if since is None or r.at > since]
    return StatsResponse(now=time.time(), num_steps=counters.num_steps,
                         num_tokens_computed=counters.num_tokens_computed,
                         num_tokens_generated=counters.num_tokens_generated,
                         steps=[StepModel(**asdict(r)) for r in recent])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
                       **error_responses(401, 403)},
            dependencies=[Depends(operator_only)],
            summary="Prometheus metrics: requests, questions, tokens, step time, batch size, queue, rejects, alerts")
async def metrics(service: KevService = Depends(get_service)) -> Response:
    if service.backend is not None:
        await service.backend.refresh_metrics()
    service.metrics.inflight.set(service.registry.num_inflight)
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
