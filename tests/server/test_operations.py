"""Operating a real `kev serve`: the Grafana dashboard queries only metrics /metrics has, JSON logs with the
start-up banner, one access line per request and the periodic stats line."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harness import REPO, ServerProcess, metric

import kev

pytestmark = pytest.mark.service

DASHBOARD = REPO / "examples" / "grafana" / "kev-dashboard.json"
SCRAPE = REPO / "examples" / "prometheus" / "prometheus.yml"
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def dashboard_metrics(path: Path) -> set[str]:
    """Every kev_* series name the dashboard's panel queries use."""
    panels = json.loads(path.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert len(exprs) >= 10, "the dashboard has its panels"
    return {name for expr in exprs for name in re.findall(r"\bkev_[a-z0-9_]+", expr)}


def exposed_series(text: str) -> set[str]:
    """The series names a scrape has: every declared family, histograms with their _bucket/_sum/_count."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names.update(name + part for part in _HISTOGRAM_PARTS)
    return names


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    return start_server({"router": {"strategy": "round_robin", "default_timeout_ms": 120_000}},
                        extra_args=["--log-format", "json", "--stats-interval", "0.5"])


@pytest.fixture(scope="module")
def answered(server, client_for) -> tuple[httpx.Client, dict[str, Any]]:
    client = client_for(server)
    body = client.post("/v1/query", json={"queries": ["What is 2+2?", "Name a colour."], "max_tokens": 6}).json()
    return client, body


def log_records(server: ServerProcess) -> list[dict[str, Any]]:
    lines = [line for line in server.log().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # --log-format json: every line is one JSON object


def wait_for(predicate: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout}s")


def test_every_metric_the_dashboard_queries_is_on_metrics(answered) -> None:
    client, _ = answered
    text = client.get("/metrics").text
    missing = dashboard_metrics(DASHBOARD) - exposed_series(text)
    assert not missing, f"the dashboard queries metrics /metrics does not have: {sorted(missing)}"
    assert metric(text, "kev_time_to_first_token_seconds_count") == 2
    assert metric(text, "kev_time_per_output_token_seconds_count") >= 1
    assert metric(text, "kev_questions_finished_total", isolation="strict") == 2
    assert metric(text, "kev_kv_blocks_total") > 0 and metric(text, "kev_kv_cache_usage_ratio") == 0, "idle again"


def test_scrape_config_targets_metrics() -> None:
    scrape = yaml.safe_load(SCRAPE.read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics" and scrape["static_configs"][0]["targets"] == ["127.0.0.1:8765"]


def test_json_logs_have_banner_access_line_and_stats(server, answered) -> None:
    _, body = answered
    records = log_records(server)
    line = next(r for r in records if "banner" in r)
    banner = line["banner"]
    assert line["logger"] == "kev.server" and f"KV pool {banner['kv_tokens']} tokens" in line["message"]
    assert banner["numerics"] and f"numerics {banner['numerics']}" in line["message"]
    assert banner["architecture"] == "llama" and banner["device"] == "cpu"
    assert banner["precision"] == kev.load_config({}).core.resolved_precision, "the precision picked, auto resolved"
    assert banner["kv_tokens"] == banner["kv_blocks"] * banner["block_size"] and banner["kv_bytes"] > 0
    access = [r for r in records if r["logger"] == "kev.access"]
    assert [(r["request_id"], r["questions"], r["statuses"]) for r in access] == [(body["request_id"], 2, {"ok": 2})]
    assert access[0]["level"] == "INFO" and access[0]["latency_ms"] > 0
    # while it ran, or at the first tick after: the tokens it generated show
    stats = wait_for(lambda: [r for r in log_records(server) if r["logger"] == "kev.stats"
                              and r["generation_tokens_per_s"] > 0])
    assert "KV cache usage" in stats[0]["message"] and stats[0]["running"] >= 0
