"""Readiness and shutdown while the model loads (issue 13, points 4 and 6).

Loading the default model takes seconds; the checks below ask while it loads and count only what
was answered while /health still said "loading" afterwards (loading never comes back), so a fast
machine cannot make them wrong. SIGTERM at that moment must still end the process with 0."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from harness import ServerProcess

pytestmark = pytest.mark.service


def is_loading(client: httpx.Client) -> bool:
    health = client.get("/health")  # readiness where vLLM / llama.cpp users probe; no key needed
    if health.status_code == 200:
        return False
    assert health.status_code == 503 and health.json()["status"] == "loading", health.text
    assert int(health.headers["Retry-After"]) >= 1
    return True


def test_loading_is_alive_but_not_ready_and_sigterm_exits_0(tmp_path: Path) -> None:
    server = ServerProcess({}, tmp_path, api_key="k").start(ready=False)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert is_loading(client), "the default model loads in seconds: the first probe comes before"
            live = client.get("/healthz")
            readyz = client.get("/readyz", headers=server.headers)
            models = client.get("/v1/models", headers=server.headers)
            still_loading = is_loading(client)
            assert live.status_code == 200  # liveness: yes, from the start
            if still_loading:  # the three answers above came while loading
                assert readyz.status_code == 503 and "Retry-After" in readyz.headers
                assert models.status_code == 503 and "Retry-After" in models.headers
                assert "loading" in models.json()["error"]["message"]
        code = server.terminate(60)
    finally:
        server.kill()
    assert code == 0, server.log()[-3000:]
    assert "terminate called" not in server.log() and "Traceback" not in server.log()


def test_sigterm_right_after_start_exits_0(tmp_path: Path) -> None:
    """Whatever the loader is doing at that moment (the real model this time)."""
    server = ServerProcess({}, tmp_path).start(ready=False)
    try:
        code = server.terminate(60)
    finally:
        server.kill()
    assert code == 0, server.log()[-3000:]
    assert "terminate called" not in server.log() and "Traceback" not in server.log()


def test_a_ready_server_says_so_on_health(start_server) -> None:
    server = start_server({}, api_key="k")
    health = httpx.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert httpx.get(f"{server.url}/v1/models", headers=server.headers, timeout=10).status_code == 200
