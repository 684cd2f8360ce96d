"""SIGTERM: stop accepting, let in-flight answers finish within the grace period, cancel the rest, exit 0."""
from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ServerProcess, busy_channels, read_sse, wait_until

pytestmark = pytest.mark.service

COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7,"}  # keeps generating until max_tokens


def stream_in_background(server: ServerProcess, body: dict[str, Any]) -> tuple[threading.Event, dict[str, Any]]:
    """Stream /v1/query in a thread; `started` is set at the first delta; outcome gets the events or the error."""
    started, outcome = threading.Event(), {}

    def read() -> None:
        lines: list[str] = []
        try:
            with httpx.stream("POST", f"{server.url}/v1/query", json={**body, "stream": True}, timeout=120) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    started.set()
        except httpx.HTTPError as err:
            outcome["error"] = err
        finally:
            outcome["events"] = read_sse([*lines, ""])
            started.set()

    outcome["thread"] = threading.Thread(target=read, daemon=True)
    outcome["thread"].start()
    return started, outcome


def test_sigterm_lets_in_flight_answers_finish(tmp_path: Path) -> None:
    """Issue 37: while they finish, the socket stays open and a newcomer gets a 503 with Retry-After."""
    server = ServerProcess({"router": {"default_timeout_ms": 120_000}}, tmp_path, extra_args=["--grace", "120"]).start()
    try:
        started, outcome = stream_in_background(server, {"queries": [COUNTING], "max_tokens": 64})
        assert started.wait(120)
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        wait_until(lambda: httpx.get(f"{server.url}/health", timeout=30).status_code == 503, what="draining")
        newcomer = httpx.post(f"{server.url}/v1/query", json={"queries": ["Hi"], "max_tokens": 2}, timeout=30)
        assert newcomer.status_code == 503 and newcomer.headers.get("Retry-After"), newcomer.text
        outcome["thread"].join(120)
        code = server.proc.wait(60)  # type: ignore[union-attr]
    finally:
        server.kill()
    assert code == 0, server.log()[-2000:]
    names = [name for name, _ in outcome["events"]]
    assert names[-1] == "done", outcome
    result = next(data for name, data in outcome["events"] if name == "result")
    assert result["status"] == "ok" and result["completion_tokens"] == 64
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/healthz", timeout=5)


def post_in_background(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["response"] = httpx.post(f"{server.url}{path}", json=body, timeout=120)
        except httpx.HTTPError as err:
            outcome["error"] = err

    outcome["thread"] = threading.Thread(target=send, daemon=True)
    outcome["thread"].start()
    return outcome


def test_sigterm_cancels_what_outlasts_the_grace_period_and_every_caller_hears_it(tmp_path: Path) -> None:
    """Issue 13: no plain-text 500, no stream torn off: cancelled results, a final event each, exit 0."""
    server = ServerProcess({}, tmp_path, extra_args=["--grace", "1"]).start()
    try:
        started, stream = stream_in_background(server, {"queries": [COUNTING, COUNTING], "max_tokens": 2000})
        assert started.wait(120)
        plain = post_in_background(server, "/v1/query", {"queries": [COUNTING], "max_tokens": 2000})
        openai = post_in_background(server, "/v1/completions", {"model": "smollm2-135m-instruct", "max_tokens": 2000,
                                                                "ignore_eos": True, **COUNTING})
        # both reach the engine: the stream's 2 questions and one each (nothing below depends on how far they got)
        wait_until(lambda: busy_channels(server) == 4, what="4 questions in their channels")
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        code = server.proc.wait(60)  # type: ignore[union-attr]
        for outcome in (stream, plain, openai):
            outcome["thread"].join(30)
    finally:
        server.kill()
    assert code == 0, server.log()[-2000:]
    names = [name for name, _ in stream["events"]]
    assert names[-1] == "done" and names.count("result") == 2, stream
    assert all(data["status"] == "cancelled" for name, data in stream["events"] if name == "result")
    assert plain["response"].status_code == 200, plain
    assert [r["status"] for r in plain["response"].json()["results"]] == ["cancelled"]
    assert openai["response"].status_code == 200, openai
    assert openai["response"].json()["choices"][0]["finish_reason"] == "cancelled"
    assert "shutdown: cancelled" in server.log() and "timeout graceful shutdown exceeded" not in server.log()
