"""The playground's serving, without a model or a browser: assets, the open page behind the API key, /v1/stats."""
from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from importlib.resources import files
from typing import Any

import pytest
from fastapi.testclient import TestClient
from harness import REPO

import kev
from kev.engine.stats import EngineStats
from kev.server.app import build_app
from kev.server.playground import ASSET_PREFIX, ASSETS, PAGE_PATHS
from kev.server.routes_ops import MAX_STEPS

KEY = "unit-key"
STATIC = files("kev.server.playground").joinpath("static")


class FakeEngine:
    """What the ops routes and shutdown touch; no model."""

    failure: str | None = None

    def __init__(self) -> None:
        self.stats = EngineStats()

    def subscribe(self, listener: Any) -> None:
        pass

    def cancel_unfinished(self) -> int:
        return 0

    def channel_states(self) -> list[dict[str, Any]]:
        return [{"channel_id": 0, "state": "idle", "request_id": None, "index": None, "tokens": 0, "kv_blocks": 0,
                 "num_served": 0}]

    def queue_length(self) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    app = build_app(kev.load_config({}), api_key=KEY, engine_factory=lambda _: engine)
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while client.get("/readyz", headers=auth()).status_code != 200:  # the fake loads in a thread, at once
            assert time.monotonic() < deadline, "fake engine never attached"
            time.sleep(0.01)
        yield client


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_page_and_assets_load_without_the_key_and_stay_on_this_origin(client: TestClient) -> None:
    for path in sorted(PAGE_PATHS):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].endswith("charset=utf-8")
        assert "default-src 'none'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"
        assert not re.search(r"https?://|@import|url\(", response.text), f"{path} loads something from elsewhere"
    assert client.get("/").headers["content-type"].startswith("text/html")


def test_every_file_the_page_loads_is_served(client: TestClient) -> None:
    """A module added to static/ but not to ASSETS would load in development and 404 in the page."""
    html = client.get("/").text
    referenced = set(re.findall(r'(?:src|href)="/playground/([\w.-]+)"', html))
    for name in [n for n in ASSETS if n.endswith(".js")]:
        referenced |= set(re.findall(r'from "\./([\w.-]+)"', (STATIC / name).read_text(encoding="utf-8")))
    assert referenced and referenced <= set(ASSETS)
    on_disk = {path.name for path in STATIC.iterdir()}
    assert on_disk == set(ASSETS), "static/ and ASSETS list the same files"


def test_package_data_ships_every_asset() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = globs["kev.server.playground"]
    for name in ASSETS:
        assert any(fnmatch(f"static/{name}", pattern) for pattern in patterns), name


def test_the_api_stays_locked_and_unknown_assets_are_not_open(client: TestClient) -> None:
    for path in ("/v1/stats", "/v1/channels", ASSET_PREFIX + "secrets.js", ASSET_PREFIX + "..%2fapp.py"):
        assert client.get(path).status_code == 401, path
    missing = client.get(ASSET_PREFIX + "secrets.js", headers=auth())
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "name"
    assert client.get(ASSET_PREFIX + "..%2f__init__.py", headers=auth()).status_code == 404


def test_stats_returns_recent_steps_after_since(client: TestClient, engine: FakeEngine) -> None:
    for n in range(3):
        engine.stats.record(num_channels=n + 1, num_tokens=10 * (n + 1), num_sampled=n + 1, step_ms=5.0)
    body = client.get("/v1/stats", headers=auth()).json()
    assert (body["num_steps"], body["num_tokens_computed"], body["num_tokens_generated"]) == (3, 60, 6)
    assert [s["num_channels"] for s in body["steps"]] == [1, 2, 3]
    assert body["now"] >= body["steps"][-1]["at"]
    since = body["steps"][0]["at"]
    later = client.get("/v1/stats", params={"since": since}, headers=auth()).json()["steps"]
    assert [s["at"] for s in later] == [s["at"] for s in body["steps"] if s["at"] > since]
    assert client.get("/v1/stats", params={"since": "soon"}, headers=auth()).status_code == 422


def test_stats_answers_at_most_max_steps(client: TestClient, engine: FakeEngine) -> None:
    for _ in range(MAX_STEPS + 5):
        engine.stats.record(num_channels=1, num_tokens=1, num_sampled=1, step_ms=1.0)
    steps = client.get("/v1/stats", headers=auth()).json()["steps"]
    assert len(steps) == MAX_STEPS and steps[-1]["at"] == engine.stats.recent[-1].at
