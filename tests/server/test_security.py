"""API key, bad input, limits and overflow: every refusal is a 4xx whose JSON names the field (and the limit)."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from harness import ServerProcess

pytestmark = pytest.mark.service

KEY = "kev-secret-key"
LIMITS = {"max_body_bytes": 4096, "max_questions": 4, "max_question_chars": 300, "max_tokens_cap": 16,
          "max_timeout_ms": 60_000, "max_inflight_requests": 4, "retry_after_s": 2}
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    config = {"server": LIMITS, "router": {"default_max_tokens": 4, "overflow_policy": "reject",
                                           "max_parallel_queries": 2, "channel_pool_size": 4,
                                           "default_timeout_ms": 120_000},
              "core": {"max_context": 64}}
    return start_server(config, api_key=KEY)


@pytest.fixture(scope="module")
def client(server, client_for) -> httpx.Client:
    return client_for(server)


def refused(response: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field and error["param"] == field and error["message"] and error["type"]
    return error


# --- API key --------------------------------------------------------------------
ROUTES = [("GET", "/readyz"), ("GET", "/v1/models"), ("GET", "/v1/channels"), ("GET", "/metrics"),
          ("GET", "/openapi.json"), ("GET", "/v1/requests/abc"), ("DELETE", "/v1/requests/abc"),
          ("POST", "/v1/query"), ("POST", "/v1/requests"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/completions")]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": KEY}, {"Authorization": f"Bearer {KEY}x"}])
def test_every_route_but_healthz_needs_the_key(server: ServerProcess, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=server.url, headers=headers) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        for method, path in ROUTES:
            response = anonymous.request(method, path, json={"queries": ["hi"]} if method == "POST" else None)
            refused(response, 401, "Authorization")
            assert response.headers["WWW-Authenticate"] == "Bearer"


def test_the_right_key_opens_every_route(client: httpx.Client) -> None:
    for method, path in ROUTES[:5]:
        assert client.request(method, path).status_code == 200


# --- malformed and mistyped input -----------------------------------------------
def test_malformed_json_and_invalid_utf8_are_400(client: httpx.Client) -> None:
    json_header = {"Content-Type": "application/json"}
    refused(client.post("/v1/query", content=b'{"queries": ["a",', headers=json_header), 400, "body")
    refused(client.post("/v1/query", content=b'{"queries": ["\xff\xfe"]}', headers=json_header), 400, "body")
    refused(client.post("/v1/chat/completions", content=b"\xc3\x28", headers=json_header), 400, "body")


@pytest.mark.parametrize(("body", "field"), [
    ({}, "queries"),
    ({"queries": []}, "queries"),
    ({"queries": "what?"}, "queries"),
    ({"queries": ["ok", 42]}, "queries[1]"),
    ({"queries": [{"text": 5}]}, "queries[0].text"),
    ({"queries": [{"text": "a", "prompt": "b"}]}, "queries[0]"),
    ({"queries": [[{"role": "wizard", "content": "hi"}]]}, "queries[0][0].role"),
    ({"queries": [{"messages": [{"role": "user"}]}]}, "queries[0].messages[0].content"),
    ({"queries": ["a"], "max_tokens": "8"}, "max_tokens"),
    ({"queries": ["a"], "temperature": -1}, "temperature"),
    ({"queries": ["a"], "temperature": 1e-9}, "temperature"),
    ({"queries": ["a"], "top_p": 0}, "top_p"),
    ({"queries": ["a"], "seed": 2**64}, "seed"),
    ({"queries": ["a"], "stream": "yes"}, "stream"),
    ({"queries": ["a"], "isolation": "paranoid"}, "isolation"),
    ({"queries": ["a"], "isolation": "loose"}, "isolation"),
    ({"queries": ["a"], "isolation": "shared"}, "isolation"),
    ({"queries": ["a"], "colour": "blue"}, "colour"),
    ('{"queries": ["ok", "\\ud800"]}', "queries[1]"),  # a lone surrogate: valid JSON, not valid text
])
def test_bad_fields_are_422_naming_the_field(client: httpx.Client, body: dict[str, Any] | str, field: str) -> None:
    if isinstance(body, str):
        response = client.post("/v1/query", content=body, headers={"Content-Type": "application/json"})
    else:
        response = client.post("/v1/query", json=body)
    refused(response, 422, field)


def test_a_body_that_is_not_an_object(client: httpx.Client) -> None:
    refused(client.post("/v1/query", json=["a", "b"]), 422, "body")
    refused(client.post("/v1/query", content=b"queries=a", headers={"Content-Type": "text/plain"}), 422, "body")


def test_a_bad_question_harms_none_of_its_neighbours(client: httpx.Client) -> None:
    too_long_for_context = "word " * 55  # under max_question_chars, over core.max_context in tokens
    results = client.post("/v1/query", json={"queries": ["Hi", "   ", too_long_for_context]}).json()["results"]
    assert results[0]["status"] == "ok" and results[0]["completion_tokens"] > 0
    assert results[1]["status"] == "error" and "queries[1]" in results[1]["error"]
    assert results[2]["status"] == "error" and "max_context" in results[2]["error"]


def test_openai_routes_refuse_a_prompt_the_engine_cannot_take(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "word " * 55}]
    refused(client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}), 400, "messages")
    body = {"model": MODEL, "prompt": ["fine", "9 " * 140]}
    refused(client.post("/v1/completions", json=body), 400, "prompt[1]")
    refused(client.post("/v1/completions", json={**body, "logprobs": 21}), 422, "logprobs")  # over OpenAI's cap


# --- limits ---------------------------------------------------------------------
def test_limits_answer_413_or_422_naming_field_and_limit(client: httpx.Client) -> None:
    cases = [
        ({"queries": ["x" * 5000]}, 413, "body", "server.max_body_bytes=4096"),
        ({"queries": ["a"] * 5}, 413, "queries", "server.max_questions=4"),
        ({"queries": ["a", "b" * 301]}, 422, "queries[1]", "server.max_question_chars=300"),  # the schema's maxLength
        ({"queries": [[{"role": "user", "content": "c" * 200}, {"role": "user", "content": "c" * 101}]]}, 413,
         "queries[0]", "server.max_question_chars=300"),
        ({"queries": ["a"], "system": "s" * 301}, 422, "system", "server.max_question_chars=300"),
        ({"queries": [{"text": "t" * 301}]}, 422, "queries[0]", "server.max_question_chars=300"),
        ({"queries": ["a"], "max_tokens": 17}, 422, "max_tokens", "max_tokens_cap=16"),
        ({"queries": [{"text": "a", "max_tokens": 17}]}, 422, "queries[0].max_tokens", "max_tokens_cap=16"),
        ({"queries": ["a"], "timeout_ms": 60_001}, 422, "timeout_ms", "server.max_timeout_ms=60000"),
    ]
    for body, status, field, limit in cases:
        assert limit in refused(client.post("/v1/query", json=body), status, field)["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert "max_questions=4" in refused(client.post("/v1/chat/completions", json={**chat, "n": 5}), 413, "n")["message"]
    too_many = {"model": MODEL, "prompt": ["a", "b", "c"], "n": 2}
    refused(client.post("/v1/completions", json=too_many), 413, "n")
    refused(client.post("/v1/chat/completions", json={**chat, "max_tokens": 17}), 422, "max_tokens")


def test_a_chunked_body_over_the_limit_is_cut_off(client: httpx.Client) -> None:
    def chunks():  # no Content-Length: the server counts what arrives
        yield b'{"queries": ["'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"]}'
    refused(client.post("/v1/query", content=chunks(), headers={"Content-Type": "application/json"}), 413, "body")


def test_wrong_method_and_unknown_route(client: httpx.Client) -> None:
    refused(client.put("/v1/query"), 405, "method")
    refused(client.get("/v2/everything"), 404, "path")


# --- overflow -------------------------------------------------------------------
def test_overload_under_reject_gets_only_200_and_429(server: ServerProcess) -> None:
    """12 requests at once against 4 in-flight slots: the rest are turned away with Retry-After, none fails."""
    async def storm() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as client:
            body = {"queries": ["Count to three.", "Name a colour."], "max_tokens": 4}
            return await asyncio.gather(*(client.post("/v1/query", json=body) for _ in range(12)))

    responses = asyncio.run(storm())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.headers["Retry-After"] == "2"
            assert response.json()["error"]["type"] == "rate_limit_error"
        else:
            assert {r["status"] for r in response.json()["results"]} == {"ok"}
