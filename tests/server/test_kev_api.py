"""The Kev API over real HTTP: /v1/query (JSON and SSE), async /v1/requests, /v1/channels, /metrics,
cancel on disconnect."""
from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from harness import ServerProcess, metric, read_sse

pytestmark = pytest.mark.service

AUDIT_FIELDS = {"request_id", "index", "channel_id", "hash_bucket", "strategy", "rerouted", "isolation", "started_at",
                "finished_at", "elapsed_ms", "prompt_tokens", "completion_tokens", "finish_reason", "status", "text",
                "token_ids", "numerics_fingerprint"}
# A raw prompt the model keeps continuing: long enough to be cancelled while it runs.
LONG = {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400}
MIXED = ["What is the capital of France?", [{"role": "user", "content": "Say hi."}],
         {"prompt": "The sky is", "max_tokens": 6}]


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    # default_max_tokens keeps the article's curl example (no max_tokens) short on a CPU;
    # round_robin: the channel tests want a request's questions side by side (semantic_hash
    # would queue two identical questions on one channel).
    return start_server({"router": {"default_max_tokens": 8, "strategy": "round_robin", "default_timeout_ms": 120_000}})


@pytest.fixture(scope="module")
def client(server, client_for) -> httpx.Client:
    return client_for(server)


def wait_until(predicate: Any, timeout: float = 30.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")


def channels_idle(client: httpx.Client) -> bool:
    body = client.get("/v1/channels").json()
    return body["num_active"] == 0 and body["queue_length"] == 0


def test_health_ready_and_schema(client: httpx.Client) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").json() == {"status": "ready", "model": "smollm2-135m-instruct", "detail": None}
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/query", "/v1/requests", "/v1/requests/{request_id}", "/v1/chat/completions", "/v1/completions",
                 "/v1/models", "/v1/channels", "/metrics", "/healthz", "/readyz"):
        assert path in paths


def test_article_curl_example(client: httpx.Client) -> None:
    response = client.post("/v1/query", content='{"queries": ["问题A", "问题B"], "isolation": "strict"}',
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    body = response.json()
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1]
    assert {r["original_text"] for r in results} == {"问题A", "问题B"}
    for r in results:
        assert AUDIT_FIELDS <= set(r)
        assert r["request_id"] == body["request_id"] == response.headers["X-Request-Id"]
        assert r["status"] == "ok" and r["isolation"] == "strict" and r["completion_tokens"] <= 8
    assert results[0]["channel_id"] != results[1]["channel_id"], "questions of one request share a channel"


def test_stream_reassembles_to_the_non_stream_answer(client: httpx.Client) -> None:
    plain = client.post("/v1/query", json={"queries": MIXED, "max_tokens": 12}).json()["results"]
    with client.stream("POST", "/v1/query", json={"queries": MIXED, "max_tokens": 12, "stream": True}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = read_sse(response.iter_lines())
    assert events[-1][0] == "done" and events[-1][1]["num_results"] == len(MIXED)
    texts, tokens, finals = {}, {}, {}
    for name, data in events[:-1]:
        if name == "delta":
            assert data["channel_id"] is not None, "every delta names its channel"
            texts[data["index"]] = texts.get(data["index"], "") + data["text"]
            tokens[data["index"]] = tokens.get(data["index"], []) + data["token_ids"]
        else:
            assert name == "result" and data["index"] not in finals, "one result event per question"
            finals[data["index"]] = data
    for expected in plain:
        i = expected["index"]
        assert texts[i] == expected["text"] == finals[i]["text"]
        assert tokens[i] == expected["token_ids"] == finals[i]["token_ids"]
        assert finals[i]["finish_reason"] == expected["finish_reason"]


def test_async_submit_poll_and_results_equal_query(client: httpx.Client) -> None:
    queries = ["Name a colour.", "Name a fruit."]
    response = client.post("/v1/requests", json={"queries": queries, "max_tokens": 8})
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["status"] == "running" and accepted["num_questions"] == 2
    assert response.headers["Location"] == accepted["location"] == f"/v1/requests/{accepted['request_id']}"
    status = wait_until(lambda: (s := client.get(accepted["location"]).json())["status"] == "done" and s)
    assert status["num_finished"] == 2
    direct = client.post("/v1/query", json={"queries": queries, "max_tokens": 8}).json()["results"]
    assert [r["token_ids"] for r in status["results"]] == [r["token_ids"] for r in direct]
    assert client.get(accepted["location"]).json()["status"] == "done", "results stay readable after they are done"


def test_delete_cancels_and_frees_channels(client: httpx.Client) -> None:
    rid = client.post("/v1/requests", json={"queries": [LONG, LONG]}).json()["request_id"]
    wait_until(lambda: sum(c["request_id"] == rid and c["state"] == "decode"
                           for c in client.get("/v1/channels").json()["channels"]) == 2)
    cancelled = client.delete(f"/v1/requests/{rid}")
    assert cancelled.status_code == 200
    body = cancelled.json()
    assert body["status"] == "cancelled" and body["num_finished"] == 2
    assert {r["status"] for r in body["results"]} == {"cancelled"}
    assert all(0 < r["completion_tokens"] < 400 for r in body["results"]), "partial answers are kept"
    assert channels_idle(client)
    assert client.get(f"/v1/requests/{rid}").json()["status"] == "cancelled"


def test_unknown_request_is_404(client: httpx.Client) -> None:
    for response in (client.get("/v1/requests/nope"), client.delete("/v1/requests/nope")):
        assert response.status_code == 404
        assert response.json()["error"]["field"] == "request_id"


def test_channels_show_the_running_question(client: httpx.Client) -> None:
    rid = client.post("/v1/requests", json={"queries": ["Hi", LONG]}).json()["request_id"]
    busy = wait_until(lambda: [c for c in client.get("/v1/channels").json()["channels"]
                               if c["request_id"] == rid and c["index"] == 1 and c["state"] == "decode"])
    assert busy[0]["tokens"] > 0 and busy[0]["kv_blocks"] > 0
    body = client.get("/v1/channels").json()
    assert len(body["channels"]) == 16 and {"queue_length", "num_active"} <= set(body)
    client.delete(f"/v1/requests/{rid}")
    assert channels_idle(client)


def test_timed_out_question_is_a_placeholder_and_others_complete(client: httpx.Client) -> None:
    queries = [{**LONG, "timeout_ms": 300}, "Say hello."]
    results = client.post("/v1/query", json={"queries": queries, "max_tokens": 8}).json()["results"]
    assert results[0]["status"] == "timeout" and results[0]["finish_reason"] == "timeout"
    assert results[1]["status"] == "ok" and results[1]["completion_tokens"] > 0


def test_stream_disconnect_cancels_its_questions(client: httpx.Client, server: ServerProcess) -> None:
    def cancelled() -> float:
        return metric(client.get("/metrics").text, "kev_questions_total", status="cancelled")

    before = cancelled()
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as own:
        with own.stream("POST", "/v1/query", json={"queries": [LONG, LONG], "stream": True}) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("event:")) == "event: delta"
    # the connection is closed now, mid-answer
    wait_until(lambda: channels_idle(client))
    after = wait_until(lambda: (m := cancelled()) >= before + 2 and m)
    assert after == before + 2


def test_non_stream_disconnect_cancels_its_questions(client: httpx.Client, server: ServerProcess) -> None:
    before = metric(client.get("/metrics").text, "kev_questions_total", status="cancelled")
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=1.0) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/query", json={"queries": [LONG]})
    wait_until(lambda: channels_idle(client))
    wait_until(lambda: metric(client.get("/metrics").text, "kev_questions_total", status="cancelled") == before + 1)


def test_metrics_counters_move(client: httpx.Client) -> None:
    before = client.get("/metrics")
    assert before.headers["content-type"].startswith("text/plain")
    results = client.post("/v1/query", json={"queries": ["One?", "Two?"], "max_tokens": 5}).json()["results"]
    after = client.get("/metrics").text
    moved = {name: metric(after, name, **labels) - metric(before.text, name, **labels) for name, labels in (
        ("kev_requests_total", {"api": "query"}), ("kev_questions_total", {"status": "ok"}),
        ("kev_completion_tokens_total", {}), ("kev_engine_steps_total", {}), ("kev_step_seconds_count", {}),
        ("kev_http_requests_total", {"route": "/v1/query", "status": "200"}))}
    assert moved["kev_requests_total"] == 1 and moved["kev_questions_total"] == 2
    assert moved["kev_completion_tokens_total"] == sum(r["completion_tokens"] for r in results)
    assert moved["kev_engine_steps_total"] >= 5 and moved["kev_step_seconds_count"] == moved["kev_engine_steps_total"]
    assert moved["kev_http_requests_total"] == 1
    for channel in {str(r["channel_id"]) for r in results}:
        assert metric(after, "kev_channel_questions_total", channel_id=channel, status="ok") >= 1
    for name in ("kev_queue_length", "kev_channels", "kev_step_channels_bucket", "kev_rejects_total",
                 "kev_isolation_alerts", "kev_hash_bucket_questions_total", "kev_inflight_requests"):
        assert f"# TYPE {name.removesuffix('_bucket').removesuffix('_total')}" in after
