"""A real cluster (nats-server, aggregator, 2 workers, router) answers over the same HTTP API as single mode,
with the same answers: token for token (greedy; Kev is batch invariant, so packing cannot change them)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import nats
import pytest

import kev
from kev.engine.kv.memory_plan import kv_pool_blocks
from tests.distributed.cluster_harness import Cluster
from harness import metric, read_sse

pytestmark = pytest.mark.service

QUESTIONS = [f"Question {i}: what is {i} plus {i + 1}?" for i in range(12)] + [
    "What is the capital of France?", "Say hi.", "Name a colour.", "Name a fruit.", "什么是KV Cache?", "写一句诗",
    [{"role": "user", "content": "Count to three."}], {"prompt": "The sky is", "max_tokens": 5},
    {"text": "Explain batching in one line.", "priority": 3}, "Hello!", "What day is it?", "2+2=?"]
VOLATILE = {"request_id", "channel_id", "elapsed_ms", "started_at", "finished_at", "queue_ms", "ttft_ms", "tpot_ms",
            "worker", "rerouted"}
LONG = {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 200}


@pytest.fixture(scope="module")
def cluster(shared_cluster: Cluster) -> Cluster:
    return shared_cluster


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.routers["router"].url, timeout=300) as client:
        yield client


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout}s")


def same_as_single(results: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Every field but where/when it ran is what single mode answers (text, tokens, reasons, audit fields)."""
    assert len(results) == len(expected)
    for got, want in zip(results, expected):
        assert {k: v for k, v in got.items() if k not in VOLATILE} == {k: v for k, v in want.items()
                                                                       if k not in VOLATILE}


def test_answers_equal_single_mode_in_slot_order(client: httpx.Client, reference: Callable[..., list]) -> None:
    body = {"queries": QUESTIONS, "max_tokens": 6}
    response = client.post("/v1/query", json=body)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == list(range(len(QUESTIONS))), "slot_map: result i is question i"
    same_as_single(results, reference(**body))
    assert {r["worker"] for r in results} == {"worker0", "worker1"}, "both workers took questions"
    assert {r["strategy"] for r in results} == {"consistent_hash"}


def test_stream_reassembles_to_the_answer(client: httpx.Client, reference: Callable[..., list]) -> None:
    body = {"queries": QUESTIONS[:6], "max_tokens": 8}
    with client.stream("POST", "/v1/query", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        events = read_sse(response.iter_lines())
    assert events[-1][0] == "done" and events[-1][1]["num_results"] == 6
    texts: dict[int, str] = {}
    tokens: dict[int, list[int]] = {}
    finals: dict[int, dict[str, Any]] = {}
    for name, data in events[:-1]:
        if name == "delta":
            assert data["index"] not in finals, "no delta after its question's result"
            texts[data["index"]] = texts.get(data["index"], "") + data["text"]
            tokens[data["index"]] = tokens.get(data["index"], []) + data["token_ids"]
        else:
            assert name == "result" and data["index"] not in finals
            finals[data["index"]] = data
    for want in reference(**body):
        i = want["index"]
        assert texts[i] == finals[i]["text"] == want["text"]
        assert tokens[i] == finals[i]["token_ids"] == want["token_ids"]


def test_seq_append_orders_by_acceptance(cluster: Cluster, reference: Callable[..., list]) -> None:
    """A second router on the same cluster, aggregator.mode seq_append: results in the order the aggregator
    accepted them (their revision in the answers bucket), whatever their indexes."""
    router = cluster.routers.get("seq") or cluster.start_router("seq", {"aggregator": {"mode": "seq_append"}})
    body = {"queries": QUESTIONS[:8], "max_tokens": 4}
    with httpx.Client(base_url=router.url, timeout=300) as client:
        results = client.post("/v1/query", json=body).json()["results"]
    revisions = asyncio.run(_revisions(cluster.nats.url, [(r["request_id"], r["index"]) for r in results]))  # type: ignore[union-attr]
    assert revisions == sorted(revisions)
    by_index = sorted(results, key=lambda r: r["index"])
    same_as_single(by_index, reference(**body))


async def _revisions(url: str, keys: list[tuple[str, int]]) -> list[int]:
    nc = await nats.connect(url)
    try:
        answers = await nc.jetstream().key_value("kev_answers")
        return [(await answers.get(f"{rid}.{index}")).revision for rid, index in keys]
    finally:
        await nc.close()


def test_openai_chat_equals_single_mode(client: httpx.Client, single: httpx.Client) -> None:
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2+2?"}],
            "max_tokens": 6, "n": 2, "temperature": 0}
    got = client.post("/v1/chat/completions", json=body).json()
    want = single.post("/v1/chat/completions", json=body).json()
    assert [c["message"] for c in got["choices"]] == [c["message"] for c in want["choices"]]
    assert got["usage"] == want["usage"] and got["system_fingerprint"] == want["system_fingerprint"]


def test_scoring_and_structure_equal_single_mode(client: httpx.Client, single: httpx.Client) -> None:
    """Logprobs, prompt logprobs and per-question constraints travel to the workers and back unchanged."""
    body = {"queries": [{"prompt": "The capital of France is", "prompt_logprobs": True, "max_tokens": 0},
                        {"text": "Is ice cold?", "structured_outputs": {"choice": ["yes", "no"]}}, "Hi"],
            "max_tokens": 4, "logprobs": 2}
    got = client.post("/v1/query", json=body).json()["results"]
    want = single.post("/v1/query", json=body).json()["results"]
    assert want[0]["prompt_logprobs"] and want[1]["text"] in ("yes", "no") and len(want[2]["logprobs"]) == 4
    same_as_single(got, want)


def test_bad_input_answers_as_single_mode(client: httpx.Client, single: httpx.Client) -> None:
    bad_option = {"queries": ["hi"], "isolation": "loose"}
    assert client.post("/v1/query", json=bad_option).json() == single.post("/v1/query", json=bad_option).json()
    mixed = {"queries": ["Say hi.", {"text": "   "}, {"prompt": "word " * 4200}], "max_tokens": 3}
    got = client.post("/v1/query", json=mixed).json()["results"]
    want = single.post("/v1/query", json=mixed).json()["results"]
    for i in (1, 2):
        assert got[i]["status"] == "error" and got[i]["error"] == want[i]["error"], got[i]
    same_as_single(got[:1], want[:1])


def test_async_poll_then_cancel_stops_the_worker(client: httpx.Client) -> None:
    done = client.post("/v1/requests", json={"queries": ["Name a colour."], "max_tokens": 4}).json()
    status = wait_until(lambda: (s := client.get(done["location"]).json())["status"] == "done" and s)
    assert status["results"][0]["status"] == "ok"
    running = client.post("/v1/requests", json={"queries": [LONG, LONG]}).json()
    wait_until(lambda: sum(c["request_id"] is not None and c["state"] == "decode"
                           for c in client.get("/v1/channels").json()["channels"]) >= 2)
    body = client.delete(running["location"]).json()
    assert body["status"] == "cancelled" and {r["status"] for r in body["results"]} == {"cancelled"}
    assert all(0 < r["completion_tokens"] < 200 for r in body["results"]), "the streamed part is kept"
    wait_until(lambda: all(c["state"] == "idle" for c in client.get("/v1/channels").json()["channels"]), 30)


def test_a_worker_timeout_is_a_placeholder_and_the_rest_complete(client: httpx.Client) -> None:
    results = client.post("/v1/query", json={"queries": [{**LONG, "timeout_ms": 300}, "Say hello."],
                                             "max_tokens": 6}).json()["results"]
    assert results[0]["status"] == "timeout" and results[0]["finish_reason"] == "timeout"
    assert results[1]["status"] == "ok" and results[1]["completion_tokens"] > 0


def test_channels_and_metrics_show_the_cluster(client: httpx.Client) -> None:
    channels = client.get("/v1/channels").json()
    assert {c["worker"] for c in channels["channels"]} == {"worker0", "worker1"}
    assert len(channels["channels"]) == 2 * 16, "every worker's channel pool"
    text = client.get("/metrics").text
    assert metric(text, "kev_workers_live") == 2 and metric(text, "kev_nats_connected") == 1
    for name in ("kev_partition_waiting", "kev_partition_running", "kev_overflow_waiting", "kev_queue_length"):
        assert f"# TYPE {name} gauge" in text
    assert metric(text, "kev_questions_total", status="ok") > 0
    # per question: observed once at the router, whichever worker answered (so every question has one e2e sample)
    assert metric(text, "kev_e2e_request_latency_seconds_count") == metric(text, "kev_questions_total")
    assert 0 < metric(text, "kev_time_to_first_token_seconds_count") <= metric(text, "kev_questions_total")
    # engine state: the live workers' heartbeats added up (two workers, one config)
    core, router = kev.load_config({}).core, kev.load_config({}).router
    pool = kv_pool_blocks("split", core.max_context, core.block_size, router.max_parallel_queries,
                          router.channel_pool_size, core.kv_cache_tokens)
    assert wait_until(lambda: metric(client.get("/metrics").text, "kev_kv_blocks_total") == 2 * pool)


def test_channels_show_each_question_of_a_grouped_request_at_its_own_index(client: httpx.Client) -> None:
    """A worker answers the questions it pulls of one request as one engine request: /v1/channels shows each at
    the caller's index (not one index for the whole group), on the worker that answers it."""
    counting = [{"prompt": ", ".join(str(n) for n in range(i, i + 6)) + ","} for i in range(8)]  # goes on counting
    body = {"queries": counting, "max_tokens": 48}
    for _ in range(5):  # a request over before a heartbeat shows two of its questions on one worker: ask again
        accepted = client.post("/v1/requests", json=body).json()
        seen: set[tuple[str, int]] = set()
        grouped, deadline = False, time.monotonic() + 300
        while (status := client.get(accepted["location"]).json())["status"] != "done":
            assert time.monotonic() < deadline, status
            held = [(c["worker"], c["index"]) for c in client.get("/v1/channels").json()["channels"]
                    if c["request_id"] == accepted["request_id"] and c["state"] != "idle"]
            assert len(held) == len(set(held)), f"two channels show the same question: {held}"
            seen |= set(held)
            grouped |= any(sum(w == worker for w, _ in held) > 1 for worker, _ in held)
            time.sleep(0.05)  # the poll's interval
        answered_by = {r["index"]: r["worker"] for r in status["results"]}
        assert all(answered_by[index] == worker for worker, index in seen), (seen, answered_by)
        if grouped and {w for w, _ in seen} == {"worker0", "worker1"}:
            return
    raise AssertionError("no heartbeat showed a grouped request on both workers")


def test_malformed_work_goes_to_dead_letters_and_the_worker_survives(cluster: Cluster, client: httpx.Client,
                                                                    reference: Callable[..., list]) -> None:
    reasons = asyncio.run(_publish_garbage_and_read_dead_letters(cluster.nats.url))  # type: ignore[union-attr]
    assert any("not valid JSON" in r or "Invalid JSON" in r for r in reasons), reasons
    assert any("index" in r for r in reasons), reasons
    assert all(role.proc.poll() is None for name, role in cluster.roles.items() if name.startswith("worker"))
    body = {"queries": ["Say hi.", "Name a fruit."], "max_tokens": 4}
    same_as_single(client.post("/v1/query", json=body).json()["results"], reference(**body))


async def _publish_garbage_and_read_dead_letters(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for partition in (0, 1):
            await js.publish(f"kev.work.p{partition}", b"{not json")
            await js.publish(f"kev.work.p{partition}", b'{"v": 1, "request_id": "abc", "index": -1}')
        sub = await js.pull_subscribe("kev.dead.work", stream="KEV_DEAD")
        reasons: list[str] = []
        deadline = time.monotonic() + 30
        while len(reasons) < 4 and time.monotonic() < deadline:
            try:
                for msg in await sub.fetch(4, timeout=1):
                    reasons.append(msg.headers["Kev-Reason"])
                    assert msg.headers["Kev-Source-Subject"].startswith("kev.work.p")
                    await msg.ack()
            except TimeoutError:
                pass
        return reasons
    finally:
        await nc.close()
