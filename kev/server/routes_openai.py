"""OpenAI-compatible routes. Every prompt x n choice is its own channel, all in the same engine run."""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kev.config.tenants import caller_of
from kev.results.result import Result
from kev.server.errors import error_responses
from kev.server.registry import Tracked
from kev.server.routes_kev import get_service
from kev.server.service import KevService
from kev.server.sse import SSE_HEADERS, SSE_RESPONSE, sse
from kev.wire.answer_errors import BodyShape, answer_error, refuse_failed
from kev.wire.bodies.errors import ApiError
from kev.wire.bodies.openai_models import (ChatCompletion, ChatCompletionBody, Completion, CompletionBody, ModelCard,
                                           ModelList)
from kev.wire.engine_call import EngineCall, chat_call, completion_call, unknown_model
from kev.wire.openai_format import Reply
from kev.wire.tools.prompt import prompt_kind

router = APIRouter(tags=["openai"])
_ERRORS = error_responses(400, 401, 404, 413, 422, 429, 503)


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503),
            summary="The one model served (503 + Retry-After while it loads)")
async def models(service: KevService = Depends(get_service)) -> ModelList:
    backend = service.loaded_backend()
    return ModelList(data=[ModelCard(id=service.model_name, created=int(service.started_at),
                                     max_model_len=service.config.core.max_context,
                                     tool_prompt=prompt_kind(backend.tokenizer))])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=error_responses(401, 404, 503),
            summary="The served model's card (404 for any other id)")
async def model(model_id: str, service: KevService = Depends(get_service)) -> ModelCard:
    card = (await models(service)).data[0]
    if model_id != card.id:
        raise unknown_model(model_id, card.id, error_type="invalid_request_error")
    return card


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses={**SSE_RESPONSE, **_ERRORS},
             summary="OpenAI chat completions; n choices run as n channels")
async def chat_completions(body: ChatCompletionBody, request: Request,
                           service: KevService = Depends(get_service)) -> Response:
    call = chat_call(body, service.served())
    return await _answer(service, request, call, body.stream, body.include_usage, "chat")


@router.post("/v1/completions", response_model=Completion, responses={**SSE_RESPONSE, **_ERRORS},
             summary="OpenAI completions; a list of prompts is answered in one engine run, one channel each")
async def completions(body: CompletionBody, request: Request, service: KevService = Depends(get_service)) -> Response:
    call = completion_call(body, service.served())
    return await _answer(service, request, call, body.stream, body.include_usage, "completion")


async def _answer(service: KevService, request: Request, call: EngineCall, stream: bool, include_usage: bool,
                  api: str) -> Response:
    reply = call.reply(service.model_name, service.decode)  # echoed token ids decoded now, while the model is here
    tracked = await service.submit(call.queries, call.sampling, call.options, api, listen=stream,
                                   tenant=caller_of(request).tenant)
    reply = reply.named(tracked.request_id)
    try:
        refuse_failed(await service.results(tracked.request_id), call.shape)
    except ApiError:
        service.release(tracked.request_id)
        raise
    if stream:
        return StreamingResponse(_chunks(service, tracked, reply, call.shape, len(call.queries), include_usage),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    results = await service.answered(tracked, request)
    if results is None:
        return Response(status_code=499)  # the caller hung up; nobody reads this
    refuse_failed(results, call.shape)  # a constraint that led nowhere is found only while answering
    return JSONResponse(reply.answer(results, call.keep).model_dump())


async def _chunks(service: KevService, tracked: Tracked, reply: Reply, shape: BodyShape, num_choices: int,
                  include_usage: bool) -> AsyncIterator[str]:
    results: list[Result] = []
    try:
        for chunk in reply.opening(num_choices):
            yield sse(chunk)
        async for event in tracked.watch.stream():
            if event.result is not None:
                results.append(event.result)
                if event.result.status == "error":
                    yield sse(answer_error(event.result, shape).body())
                    continue
            for delta in reply.event_chunks(event):
                yield sse(delta)
        if include_usage:
            yield sse(reply.chunk([], reply.usage(results)))
        yield sse("[DONE]")
    finally:  # a client that hangs up cancels its questions
        service.release(tracked.request_id)
