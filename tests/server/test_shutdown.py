"""SIGTERM: stop accepting, let in-flight answers finish within the grace period, cancel the rest, exit 0."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ServerProcess, read_sse

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
    server = ServerProcess({"aggregator": {"timeout_ms": 120_000}}, tmp_path, extra_args=["--grace", "120"]).start()
    try:
        started, outcome = stream_in_background(server, {"queries": [COUNTING], "max_tokens": 24})
        assert started.wait(120)
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        outcome["thread"].join(120)
        code = server.proc.wait(60)  # type: ignore[union-attr]
    finally:
        server.kill()
    assert code == 0, server.log()[-2000:]
    names = [name for name, _ in outcome["events"]]
    assert names[-1] == "done", outcome
    result = next(data for name, data in outcome["events"] if name == "result")
    assert result["status"] == "ok" and result["completion_tokens"] == 24
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/healthz", timeout=5)


def test_sigterm_cancels_what_outlasts_the_grace_period(tmp_path: Path) -> None:
    server = ServerProcess({"aggregator": {"timeout_ms": 600_000}}, tmp_path, extra_args=["--grace", "1"]).start()
    try:
        started, outcome = stream_in_background(server, {"queries": [COUNTING, COUNTING], "max_tokens": 2000})
        assert started.wait(120)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        code = server.proc.wait(60)  # type: ignore[union-attr]
        waited = time.monotonic() - signalled
        outcome["thread"].join(30)
    finally:
        server.kill()
    assert code == 0, server.log()[-2000:]
    assert "done" not in [name for name, _ in outcome["events"]], "2000 tokens cannot have finished"
    assert waited < 60
    assert "timeout graceful shutdown exceeded" in server.log() and "shutdown: cancelled" in server.log()
