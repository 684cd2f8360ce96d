"""Every response body, stream chunk, error, file, batch and model object of the OpenAI routes validates against the
component schemas of OpenAI's published OpenAPI document (openai/openai-openapi; the shipped subset names its
commit and version)."""
from __future__ import annotations

import io
import json
import time
from typing import Any

import httpx
import openai
import pytest
from harness import read_sse
from openai_schema import conforms

pytestmark = pytest.mark.service
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What time is it in UTC?"}]


@pytest.fixture(scope="module")
def model(openai_client: openai.OpenAI) -> str:
    return openai_client.models.list().data[0].id


def _stream(http: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    with http.stream("POST", path, json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        events = read_sse(reply.iter_lines())
    return [data for _, data in events if data != "[DONE]"]


def test_chat_completions_plain_tools_and_logprobs_conform(kev_http: httpx.Client, model: str) -> None:
    bodies = [{"messages": ASK, "max_tokens": 6},
              {"messages": ASK, "max_tokens": 24, "tools": [TOOL], "tool_choice": "required"},
              {"messages": ASK, "max_tokens": 4, "logprobs": True, "top_logprobs": 2, "n": 2, "seed": 1}]
    for body in bodies:
        reply = kev_http.post("/v1/chat/completions", json={"model": model, **body})
        assert reply.status_code == 200, reply.text
        conforms(reply.json(), "CreateChatCompletionResponse")
        assert reply.json()["choices"][0]["message"]["refusal"] is None
        for chunk in _stream(kev_http, "/v1/chat/completions",
                             {"model": model, **body, "stream_options": {"include_usage": True}}):
            conforms(chunk, "CreateChatCompletionStreamResponse")


def test_completions_and_their_chunks_conform(kev_http: httpx.Client, model: str) -> None:
    body = {"model": model, "prompt": ["Paris is", "Rome is"], "max_tokens": 4, "logprobs": 1}
    reply = kev_http.post("/v1/completions", json=body)
    conforms(reply.json(), "CreateCompletionResponse")
    for chunk in _stream(kev_http, "/v1/completions", {**body, "logprobs": None}):
        if chunk["choices"] and chunk["choices"][0]["finish_reason"] is not None:
            conforms(chunk, "CreateCompletionResponse")


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/chat/completions", {"model": "nope", "messages": ASK}),
    ("POST", "/v1/chat/completions", {"messages": ASK}),
    ("POST", "/v1/completions", {"model": "MODEL", "prompt": "x", "max_tokens": 10 ** 9}),
    ("GET", "/v1/models/nope", None),
])
def test_errors_conform(kev_http: httpx.Client, model: str, method: str, path: str, body: Any) -> None:
    if body is not None and body.get("model") == "MODEL":
        body = {**body, "model": model}
    reply = kev_http.request(method, path, json=body)
    assert 400 <= reply.status_code < 500
    conforms(reply.json(), "ErrorResponse")


def test_models_list_and_retrieve_conform(openai_client: openai.OpenAI, kev_http: httpx.Client, model: str) -> None:
    conforms(kev_http.get("/v1/models").json(), "ListModelsResponse")
    card = kev_http.get(f"/v1/models/{model}").json()
    conforms(card, "Model")
    assert openai_client.models.retrieve(model).id == model == card["id"]


def test_files_and_batches_and_batch_output_lines_conform(openai_client: openai.OpenAI, kev_http: httpx.Client,
                                                          model: str) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": ASK, "max_tokens": 4}}
    uploaded = openai_client.files.create(file=("in.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                                          purpose="batch")
    conforms(kev_http.get(f"/v1/files/{uploaded.id}").json(), "OpenAIFile")
    listed = kev_http.get("/v1/files").json()
    conforms(listed, "ListFilesResponse")
    assert listed["first_id"] and listed["last_id"] and listed["has_more"] is False
    batch = openai_client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    deadline = time.monotonic() + 300
    while (done := kev_http.get(f"/v1/batches/{batch.id}").json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, done
        time.sleep(0.2)
    conforms(done, "Batch")
    conforms(kev_http.get("/v1/batches").json(), "ListBatchesResponse")
    output = openai_client.files.content(done["output_file_id"]).text.splitlines()
    conforms(json.loads(output[0])["response"]["body"], "CreateChatCompletionResponse")
