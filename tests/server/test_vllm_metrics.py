"""/metrics under vLLM's names and labels after real traffic: every metric vLLM's Grafana dashboard queries
(examples/vllm-dashboard-queries.md) has a sample with model_name, and each agrees with Kev's own metric of the
same quantity."""
from __future__ import annotations

import re

import pytest
from harness import REPO, ServerProcess, metric

pytestmark = pytest.mark.service

QUERIES = REPO / "examples" / "vllm-dashboard-queries.md"
NAME = "smol-served"


def dashboard_series() -> set[str]:
    block = QUERIES.read_text().split("```promql")[1].split("```")[0]
    names = set(re.findall(r"\bvllm:[a-z_:]+", block)) - {"vllm:"}
    assert len(names) >= 15
    return names


@pytest.fixture(scope="module")
def scrape(start_server, client_for) -> str:
    server: ServerProcess = start_server({"server": {"model_name": NAME},
                                          "router": {"default_timeout_ms": 120_000}})
    client = client_for(server)
    for prompt in ("Name a colour.", "What is 2+2?"):
        reply = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 8, "temperature": 0,
                                                          "messages": [{"role": "user", "content": prompt}]})
        assert reply.status_code == 200, reply.text
    assert client.post("/v1/completions", json={"model": NAME, "prompt": "Once upon", "max_tokens": 3}).status_code \
        == 200
    return client.get("/metrics").text


def test_every_metric_the_vllm_dashboard_queries_has_a_sample(scrape: str) -> None:
    samples = {line.partition("{")[0]: line for line in scrape.splitlines() if line.startswith("vllm:")}
    missing = sorted(name for name in dashboard_series() if name not in samples)
    assert not missing, f"no sample for {missing}"
    unlabelled = [line for line in scrape.splitlines() if line.startswith("vllm:") and f'model_name="{NAME}"'
                  not in line]
    assert not unlabelled


def test_vllm_names_carry_kev_quantities(scrape: str) -> None:
    assert metric(scrape, "vllm:prompt_tokens_total") == metric(scrape, "kev_prompt_tokens_total") > 0
    assert metric(scrape, "vllm:generation_tokens_total") == metric(scrape, "kev_completion_tokens_total") > 0
    assert metric(scrape, "vllm:e2e_request_latency_seconds_count") == 3
    assert metric(scrape, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        metric(scrape, "kev_time_to_first_token_seconds_sum"))
    finished = sum(metric(scrape, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length"))
    assert finished == 3 and metric(scrape, "vllm:request_success_total", finished_reason="abort") == 0
    assert metric(scrape, "vllm:num_requests_running") == metric(scrape, "kev_questions_running") == 0
    assert metric(scrape, "vllm:kv_cache_usage_perc") == metric(scrape, "kev_kv_cache_usage_ratio")
