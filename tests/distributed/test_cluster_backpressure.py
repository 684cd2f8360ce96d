"""Backpressure: a burst of 10x the cluster's channels against routers whose overflow_policy is `reject` or `queue`.

The routers say their partitions have room for 2 waiting questions each (channel_pool_size 2 x
channel_queue_depth 1); the burst is 10 x (2 workers x 2 channels) = 40 requests at once. Every
answer is 200 or 429, every 200 carries its full answer (equal to single mode), and the backlog
shows in /metrics (the router's high-water marks, read after the burst).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import nats
import pytest

from tests.distributed.cluster_harness import Cluster
from tests.distributed.test_cluster_e2e import same_as_single
from harness import metric

pytestmark = pytest.mark.service

SMALL = {"channel_pool_size": 2, "max_parallel_queries": 2, "channel_queue_depth": 1, "breaker_threshold": 0}
QUESTIONS = ["Say hi.", "Name a colour.", "Name a fruit.", "What is 2+2?", "Hello!", "写一句诗", "Count to three.",
             "What is the capital of France?"]
BURST = 10 * 2 * 2


def burst(url: str, nats_url: str) -> tuple[list[httpx.Response], int]:
    """BURST single-question requests at once; also the largest number the overflow queue really held (JetStream's
    count, polled: a bound that a missed moment can only make easier, never red)."""
    held: list[int] = []
    stop = threading.Event()

    async def watch_queue() -> None:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        while not stop.is_set():
            held.append((await js.consumer_info("KEV_WORK", "KEV_any")).num_pending or 0)
            await asyncio.sleep(0.01)
        await nc.close()

    def ask(i: int) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=300) as client:
            return client.post("/v1/query", json={"queries": [QUESTIONS[i % len(QUESTIONS)]], "max_tokens": 3})

    watcher = threading.Thread(target=asyncio.run, args=(watch_queue(),))
    watcher.start()
    with ThreadPoolExecutor(BURST) as pool:
        responses = list(pool.map(ask, range(BURST)))
    stop.set()
    watcher.join(10)
    return responses, max(held, default=0)


def check(responses: list[httpx.Response], reference: Callable[..., list]) -> dict[int, int]:
    codes = {code: sum(r.status_code == code for r in responses) for code in {r.status_code for r in responses}}
    assert set(codes) <= {200, 429}, {r.status_code: r.text for r in responses if r.status_code not in (200, 429)}
    expected = {q: e for q, e in zip(QUESTIONS, reference(QUESTIONS, max_tokens=3))}
    for i, response in enumerate(responses):
        if response.status_code == 429:
            assert response.headers["Retry-After"] and response.json()["error"]["type"] == "rate_limit_error"
        else:
            same_as_single(response.json()["results"], [{**expected[QUESTIONS[i % len(QUESTIONS)]], "index": 0}])
    return codes


@pytest.mark.parametrize("policy", ["reject", "queue"])
def test_a_burst_gets_200_or_429_and_nothing_is_lost(shared_cluster: Cluster, reference: Callable[..., list],
                                                     policy: str) -> None:
    extra: dict[str, Any] = {"router": {**SMALL, "overflow_policy": policy, "max_queue": 4}}
    router = shared_cluster.routers.get(policy) or shared_cluster.start_router(policy, extra)
    before = metric(httpx.get(f"{router.url}/metrics").text, "kev_rejects_total", reason=f"overflow_{policy}")
    responses, overflow_held = burst(router.url, shared_cluster.nats.url)  # type: ignore[union-attr]
    codes = check(responses, reference)
    text = httpx.get(f"{router.url}/metrics").text  # the router's high-water marks: no backlog can slip between scrapes
    peak = {name: metric(text, f"kev_{name}_waiting_peak") for name in ("partition", "overflow")}
    print(f"{policy}: {codes}, peak backlog {peak}, overflow queue held {overflow_held}")
    assert codes.get(200, 0) >= 4 and codes.get(429, 0) >= 1, codes
    assert peak["partition"] > 0, "the backlog showed in /metrics"
    assert overflow_held <= 4, "router.max_queue bounds the overflow queue"
    assert (peak["overflow"] > 0) == (policy == "queue"), "only `queue` holds questions in the overflow queue"
    after = metric(text, "kev_rejects_total", reason=f"overflow_{policy}")
    assert after - before == codes.get(429, 0)
