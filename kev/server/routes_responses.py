"""OpenAI's Responses API: POST /v1/responses (plain and streamed), GET and DELETE /v1/responses/{id} (stored
responses, each tenant its own). A Responses body is turned into the chat completion body it means and run as
/v1/chat/completions runs one (the same tools, grammar and formatting): one question, its own channel."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from kev.results.result import Result
from kev.wire.answer_errors import BodyShape, answer_error, refuse_failed
from kev.wire.engine_call import chat_call
from kev.wire.bodies.errors import ApiError, field_path
from kev.server.errors import error_responses
from kev.wire.openai_format import Reply
from kev.wire.bodies.openai_models import ChatCompletionBody
from kev.server.registry import Tracked
from kev.wire.responses.body import ResponsesBody
from kev.wire.responses.objects import (EventStream, new_id, output_items, response_object, status_of,
                                          usage_of)
from kev.wire.responses.store import ResponseStore, Stored
from kev.server.routes_kev import get_service
from kev.server.service import KevService
from kev.server.sse import SSE_HEADERS, SSE_RESPONSE, sse
from kev.config.tenants import caller_of

router = APIRouter(tags=["openai"])


def get_responses(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.responses
    return store


@router.post("/v1/responses", responses={**SSE_RESPONSE, **error_responses(400, 401, 404, 413, 422, 429, 503)},
             summary="OpenAI Responses: one answer in its own channel (streamed with the Responses events)")
async def create_response(body: ResponsesBody, request: Request, service: KevService = Depends(get_service),
                          store: ResponseStore = Depends(get_responses)) -> Response:
    tenant = caller_of(request).tenant
    earlier: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = store.get(tenant, body.previous_response_id)
        if previous is None:
            raise ApiError(404, f"previous_response_id: {body.previous_response_id!r} is not a stored response of "
                                "this caller", "previous_response_id")
        earlier = previous.messages
    chat_body = body.chat_body(earlier)
    try:
        chat = ChatCompletionBody.model_validate(chat_body)
    except ValidationError as err:
        problem = err.errors()[0]
        where = field_path(("body", *problem["loc"]))
        raise ApiError(400, f"{where} (of the chat body this request means): {problem['msg']}", where) from None
    call = chat_call(chat, service.served(), chars_field="input")
    created = int(time.time())
    reply = dataclasses.replace(call.reply(service.model_name, service.decode), id=new_id("resp"), created=created)
    tracked = await service.submit(call.queries, call.sampling, call.options, "responses", listen=body.stream,
                                   tenant=tenant)
    shape = call.shape
    try:
        refuse_failed(await service.results(tracked.request_id), shape)
    except ApiError:
        service.release(tracked.request_id)
        raise
    conversation = chat_body["messages"]
    if body.stream:
        return StreamingResponse(_events(service, store, tenant, tracked, reply, body, shape, conversation),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    results = await service.answered(tracked, request)
    if results is None:
        return Response(status_code=499)  # the caller hung up; nobody reads this
    refuse_failed(results, shape)
    answer = reply.answer(results, call.keep).model_dump()
    choice = answer["choices"][0]
    status, incomplete = status_of(choice["finish_reason"])
    response = response_object(reply.id, body, created, service.model_name, output_items(choice["message"]), status,
                               incomplete, usage_of(answer["usage"]))
    _keep(store, tenant, body, response, conversation)
    return JSONResponse(response)


def _keep(store: ResponseStore, tenant: str, body: ResponsesBody, response: dict[str, Any],
          conversation: list[dict[str, Any]]) -> None:
    """store: true keeps the response and its conversation (its output as an assistant turn) for the tenant."""
    if not body.store:
        return
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                      "arguments": item["arguments"]}}
             for item in response["output"] if item["type"] == "function_call"]
    turn: dict[str, Any] = {"role": "assistant", "content": response["output_text"] or None}
    if calls:
        turn["tool_calls"] = calls
    elif turn["content"] is None:
        turn["content"] = ""
    store.put(tenant, Stored(response, [*conversation, turn]))


async def _events(service: KevService, store: ResponseStore, tenant: str, tracked: Tracked, reply: Reply,
                  body: ResponsesBody, shape: BodyShape, conversation: list[dict[str, Any]]) -> AsyncIterator[str]:
    results: list[Result] = []
    opened = response_object(reply.id, body, reply.created, reply.model, [], "in_progress", None, None)
    stream = EventStream(opened)
    try:
        for event in stream.opening():
            yield sse(event, event["type"])
        async for engine_event in tracked.watch.stream():
            if engine_event.result is not None:
                results.append(engine_event.result)
                if engine_event.result.status == "error":
                    error = stream.error(answer_error(engine_event.result, shape).body())
                    yield sse(error, error["type"])
                    return
            for chunk in reply.event_chunks(engine_event):
                for event in stream.chunk(chunk):
                    yield sse(event, event["type"])
        for event in stream.closing():
            yield sse(event, event["type"])
        status, incomplete = status_of(stream.finish_reason)
        response = response_object(reply.id, body, reply.created, reply.model, stream.output, status, incomplete,
                                   usage_of(reply.usage(results).model_dump()))
        _keep(store, tenant, body, response, conversation)
        done = stream.finished(response)
        yield sse(done, done["type"])
    finally:  # a client that hangs up cancels its question
        service.release(tracked.request_id)


@router.get("/v1/responses/{response_id}", responses=error_responses(401, 404),
            summary="A stored response (the caller's own)")
async def get_response(response_id: str, request: Request,
                       store: ResponseStore = Depends(get_responses)) -> dict[str, Any]:
    stored = store.get(caller_of(request).tenant, response_id)
    if stored is None:
        raise ApiError(404, f"response_id: {response_id!r} is not a stored response of this caller", "response_id")
    return stored.response


@router.delete("/v1/responses/{response_id}", responses=error_responses(401, 404),
               summary="Forget a stored response (the caller's own)")
async def delete_response(response_id: str, request: Request,
                          store: ResponseStore = Depends(get_responses)) -> dict[str, Any]:
    if not store.delete(caller_of(request).tenant, response_id):
        raise ApiError(404, f"response_id: {response_id!r} is not a stored response of this caller", "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}
