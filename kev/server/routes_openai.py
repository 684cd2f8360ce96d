"""OpenAI-compatible routes. Every prompt x n choice is its own channel, all in the same engine run."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kev.results.result import Result
from kev.engine.sampling_params import SamplingParams
from kev.wire.answer_errors import BodyShape, answer_error, first_failure
from kev.wire.bodies.errors import ApiError
from kev.server.errors import error_responses
from kev.wire.openai_format import Reply, best_of
from kev.wire.bodies.openai_models import (ChatCompletion, ChatCompletionBody, Completion, CompletionBody, ModelCard,
                                      ModelList)
from kev.server.registry import Tracked
from kev.server.routes_kev import get_service
from kev.server.service import KevService
from kev.server.sse import SSE_HEADERS, SSE_RESPONSE, sse
from kev.config.tenants import caller_of
from kev.wire.tools.prompt import prompt_kind
from kev.wire.tools.reply import ToolReply
from kev.wire.tools.request import plan_tools

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
        raise ApiError(404, f"model: {model_id!r} is not served here (this server serves {card.id!r})", "model",
                       error_type="invalid_request_error")
    return card


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses={**SSE_RESPONSE, **_ERRORS},
             summary="OpenAI chat completions; n choices run as n channels")
async def chat_completions(body: ChatCompletionBody, request: Request,
                           service: KevService = Depends(get_service)) -> Response:
    _check_common(service, body.model, body.num_candidates, body.max_completion_tokens or body.max_tokens,
                  body.timeout_ms)
    service.limits.check_max_tokens(body.max_tokens, "max_tokens")  # over the cap even beside max_completion_tokens
    body.check_supported()
    service.limits.check_chars(sum(len(m.text) for m in body.messages), "messages")
    sampling = body.engine_sampling(body.max_completion_tokens or body.max_tokens, body.logprob_options())
    query: dict[str, Any] = {"messages": [m.to_engine() for m in body.messages]}
    tools = None
    if body.uses_tools:  # rendered here, with the tools; the engine takes the prompt as it is
        plan = plan_tools(body, service.tokenizer(), service.config.server.tool_call_parser,
                          service.config.isolation.system_prompt)
        query, tools = {"prompt": plan.prompt}, plan.reply
        if plan.structure is not None:
            sampling = dataclasses.replace(sampling, structured_outputs=plan.structure)
    queries = [body.seeded(query, j) for j in range(body.num_candidates)]
    reply = Reply("chat", "", int(time.time()), service.model_name, body.num_candidates, logprobs=bool(body.logprobs),
                  tools=tools)
    return await _answer(service, request, reply, queries, sampling, body.request_options(), body.stream,
                         body.include_usage, "chat", body.structure()[0] or _tool_field(tools), keep=body.n)


@router.post("/v1/completions", response_model=Completion, responses={**SSE_RESPONSE, **_ERRORS},
             summary="OpenAI completions; a list of prompts is answered in one engine run, one channel each")
async def completions(body: CompletionBody, request: Request, service: KevService = Depends(get_service)) -> Response:
    prompts = body.prompts
    max_tokens = body.resolved_max_tokens(service.limits.max_tokens_cap)
    _check_common(service, body.model, len(prompts) * body.num_candidates, max_tokens, body.timeout_ms)
    body.check_supported()
    for i, prompt in enumerate(prompts):
        service.limits.check_chars(len(prompt), "prompt" if body.is_single else f"prompt[{i}]")
    queries = body.engine_queries()
    sampling = body.engine_sampling(max_tokens, body.logprob_options(max_tokens))
    echo = tuple(p if isinstance(p, str) else service.tokenizer().decode(p, skip_special_tokens=False)
                 for p in prompts) if body.echo else None
    reply = Reply("text", "", int(time.time()), service.model_name, body.num_candidates, body.logprobs is not None,
                  echo)
    return await _answer(service, request, reply, queries, sampling, body.request_options(), body.stream,
                         body.include_usage, "completion", body.structure()[0], body.is_single, keep=body.n)


def _tool_field(tools: ToolReply | None) -> str | None:
    """A forced call's grammar is the tools' schemas: a schema that does not compile is the tools' fault."""
    return "tools" if tools is not None and tools.mode in ("named", "required") else None


def _check_common(service: KevService, model: str, num_questions: int, max_tokens: int | None,
                  timeout_ms: int | None) -> None:
    if model != service.model_name:
        raise ApiError(404, f"model: {model!r} is not served here (this server serves {service.model_name!r})",
                       "model")
    service.limits.check_count(num_questions, "n")
    service.limits.check_max_tokens(max_tokens, "max_tokens")
    service.limits.check_timeout(timeout_ms, "timeout_ms")


async def _answer(service: KevService, request: Request, reply: Reply, queries: list[Any], sampling: SamplingParams,
                  options: dict[str, Any],
                  stream: bool, include_usage: bool, api: str, structure_field: str | None = None,
                  single_prompt: bool = False, keep: int | None = None) -> Response:
    tracked = await service.submit(queries, sampling, options, api, listen=stream, tenant=caller_of(request).tenant)
    prefix = "chatcmpl-" if reply.kind == "chat" else "cmpl-"
    reply = dataclasses.replace(reply, id=prefix + tracked.request_id)
    shape = BodyShape(reply.kind, reply.n, single_prompt, structure_field)
    try:
        _refuse_bad_prompts(await service.results(tracked.request_id), shape)
    except ApiError:
        service.release(tracked.request_id)
        raise
    if stream:
        return StreamingResponse(_chunks(service, tracked, reply, shape, len(queries), include_usage),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        if not await service.wait(tracked, request):
            return Response(status_code=499)
        results = await service.results(tracked.request_id)
    finally:
        service.release(tracked.request_id)
    _refuse_bad_prompts(results, shape)  # a constraint that led nowhere is found only while answering
    usage = reply.usage(results)  # every candidate's tokens count, as OpenAI bills best_of
    if keep is not None and keep < reply.n:
        results, reply = best_of(results, reply.n, keep), dataclasses.replace(reply, n=keep)
    return JSONResponse(reply.response(results, usage).model_dump())


def _refuse_bad_prompts(results: list[Result], shape: BodyShape) -> None:
    """A prompt the engine refused at submit (e.g. longer than core.max_context, a token id outside the
    vocabulary, a schema that does not compile) fails the whole call, as with OpenAI; the error names the body's
    field."""
    failed = first_failure(results)
    if failed is not None:
        raise answer_error(failed, shape)


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
