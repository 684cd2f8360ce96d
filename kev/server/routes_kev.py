"""The Kev API: /v1/query (answers at once or as SSE) and the async /v1/requests."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kev.wire.bodies.api_models import Accepted, QueryBody, QueryResponse, RequestStatus, SubmitBody
from kev.server.errors import error_responses
from kev.server.registry import Tracked
from kev.server.request_constraint import request_constraint_error
from kev.server.service import KevService
from kev.server.sse import SSE_HEADERS, SSE_RESPONSE, sse
from kev.config.tenants import Caller, caller_of

router = APIRouter(tags=["kev"])
_SUBMIT_ERRORS = error_responses(400, 401, 413, 422, 429, 503)
_BY_ID_ERRORS = error_responses(401, 404, 422, 503)


def get_service(request: Request) -> KevService:
    return request.app.state.service


@router.post("/v1/query", response_model=QueryResponse, responses={**SSE_RESPONSE, **_SUBMIT_ERRORS},
             summary="Answer questions, each in its own channel, in one engine run")
async def query(body: QueryBody, request: Request, service: KevService = Depends(get_service),
                caller: Caller = Depends(caller_of)) -> Response:
    """With `"stream": true` the answer is Server-Sent Events: `delta` (index, channel_id, text, token_ids),
    then one `result` per question (every audit field) and a final `done`."""
    service.limits.check_submit(body)
    tracked = await service.submit(body.engine_queries(), *body.engine_submit(), "query", listen=body.stream,
                                   tenant=caller.tenant)
    request_id = tracked.request_id
    if body.stream:
        return StreamingResponse(_events(service, tracked), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, "X-Request-Id": request_id})
    results = await service.answered(tracked, request)
    if results is None:
        return Response(status_code=499)  # the caller hung up; nobody reads this
    failed = request_constraint_error(body, results)
    if failed is not None:
        raise failed
    return JSONResponse({"request_id": request_id, "results": [r.to_dict() for r in results]},
                        headers={"X-Request-Id": request_id})


async def _events(service: KevService, tracked: Tracked) -> AsyncIterator[str]:
    request_id = tracked.request_id
    try:
        async for event in tracked.watch.stream():
            if event.result is not None:
                yield sse(event.result.to_dict(), "result")
            elif event.text or event.token_ids:
                delta = {"request_id": request_id, "index": event.index, "channel_id": event.channel_id,
                         "text": event.text, "token_ids": event.token_ids}
                yield sse({**delta, "logprobs": event.logprobs} if event.logprobs else delta, "delta")
        yield sse({"request_id": request_id, "num_results": tracked.watch.num_questions}, "done")
    finally:  # also when the client disconnects: its questions are cancelled and their channels freed
        service.release(request_id)


@router.post("/v1/requests", status_code=202, response_model=Accepted, responses=_SUBMIT_ERRORS,
             summary="Submit questions and return at once; poll GET /v1/requests/{request_id}")
async def submit(body: SubmitBody, service: KevService = Depends(get_service),
                 caller: Caller = Depends(caller_of)) -> JSONResponse:
    service.limits.check_submit(body)
    tracked = await service.submit(body.engine_queries(), *body.engine_submit(), "async", retained=True,
                                   tenant=caller.tenant)
    location = f"/v1/requests/{tracked.request_id}"
    accepted = Accepted(request_id=tracked.request_id, status="running", num_questions=tracked.watch.num_questions,
                        location=location)
    return JSONResponse(accepted.model_dump(), status_code=202, headers={"Location": location})


@router.get("/v1/requests/{request_id}", response_model=RequestStatus, responses=_BY_ID_ERRORS,
            summary="Status of a request and its results so far")
async def status(request_id: str, service: KevService = Depends(get_service),
                 caller: Caller = Depends(caller_of)) -> RequestStatus:
    return await _status(service, service.tracked(request_id, caller.tenant))


@router.delete("/v1/requests/{request_id}", response_model=RequestStatus, responses=_BY_ID_ERRORS,
               summary="Cancel a request's unfinished questions (they come back with status cancelled)")
async def cancel(request_id: str, service: KevService = Depends(get_service),
                 caller: Caller = Depends(caller_of)) -> RequestStatus:
    """Any of the caller's requests in flight: async, a waiting /v1/query or OpenAI call, or a stream (which then
    ends with the cancelled results)."""
    tracked = service.tracked(request_id, caller.tenant)
    await service.cancel(tracked)
    return await _status(service, tracked)


async def _status(service: KevService, tracked: Tracked) -> RequestStatus:
    results = await service.results_of(tracked)
    total = tracked.watch.num_questions
    state: Literal["cancelled", "done", "running"] = (
        "cancelled" if tracked.cancelled else "done" if len(results) == total else "running")
    return RequestStatus(request_id=tracked.request_id, status=state, num_questions=total, num_finished=len(results),
                         results=[r.to_dict() for r in results])
