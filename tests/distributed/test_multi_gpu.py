"""deploy.mode multi_gpu on CPU: two engine replicas ("cpu", "cpu") in one process, questions placed across them
by the router; every answer equals the single-engine answer token for token (same kernels, same tiles: batch
invariance makes the replica a question lands on irrelevant)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import kev
from kev.engine.replicas import ReplicaEngine
from tests.distributed.test_cluster_e2e import same_as_single
from harness import ServerProcess

QUESTIONS = ["What is the capital of France?", "Say hi.", "Name a colour.", "写一句诗", "Count to three.",
             {"prompt": "The sky is"}, [{"role": "user", "content": "2+2?"}], "Name a fruit."]
CONFIG = {"deploy": {"mode": "multi_gpu", "devices": ["cpu", "cpu"]},
          "core": {"precision": "fp32"},  # as the shared fp32 engine it is compared with
          "router": {"strategy": "consistent_hash", "channel_pool_size": 8, "max_parallel_queries": 4,
                     "default_timeout_ms": 600_000}}


@pytest.fixture(scope="module")
def replicas() -> Iterator[ReplicaEngine]:
    engine = ReplicaEngine(kev.load_config(CONFIG))
    yield engine
    engine.close()


def test_replicas_answer_as_one_engine(replicas: ReplicaEngine, make_engine: Callable[..., Any]) -> None:
    assert replicas.replicas[0].runner.model is replicas.replicas[1].runner.model, "one copy of the weights per device"
    expected = make_engine().generate(QUESTIONS, max_tokens=6, timeout=600)
    results = replicas.generate(QUESTIONS, max_tokens=6, timeout=600)
    assert [r.index for r in results] == list(range(len(QUESTIONS)))
    assert [r.token_ids for r in results] == [r.token_ids for r in expected]
    assert [r.text for r in results] == [r.text for r in expected]
    assert {r.worker for r in results} == {"replica0:cpu", "replica1:cpu"}, "both replicas took questions"
    # /metrics and the banner: the replicas added up
    one = replicas.replicas[0]
    assert replicas.load().kv_blocks_total == 2 * one.load().kv_blocks_total and replicas.load().num_running == 0
    info = replicas.describe()
    assert info["replicas"] == 2 and info["device"] == "cpu,cpu"
    assert info["kv_tokens"] == 2 * one.describe()["kv_tokens"]


def test_streams_merge_and_cancel_is_immediate(replicas: ReplicaEngine) -> None:
    rid = replicas.submit(QUESTIONS[:4], max_tokens=5)
    texts: dict[int, str] = {}
    finals = {}
    for event in replicas.stream(rid, timeout=600):
        if event.result is not None:
            finals[event.index] = event.result
        else:
            texts[event.index] = texts.get(event.index, "") + event.text
    assert sorted(finals) == [0, 1, 2, 3] and all(texts.get(i, "") == finals[i].text for i in finals)
    long = replicas.submit([{"prompt": "1, 2, 3,", "max_tokens": 400}] * 2)
    replicas.cancel(long)
    assert {r.status for r in replicas.results(long)} == {"cancelled"}
    replicas.forget(long)
    assert len(replicas.channel_states()) == 16 and {s["worker"] for s in replicas.channel_states()} == {
        "replica0:cpu", "replica1:cpu"}


@pytest.mark.service
def test_kev_serve_in_multi_gpu_mode_answers_as_single(tmp_path: Any, reference: Callable[..., list]) -> None:
    server = ServerProcess({**CONFIG, "core": {"threads": 1}, "router": {**CONFIG["router"], "default_max_tokens": 8}},
                           tmp_path).start(timeout=600)
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            body = {"queries": QUESTIONS, "max_tokens": 5}
            results = client.post("/v1/query", json=body).json()["results"]
            assert len(client.get("/v1/channels").json()["channels"]) == 16
        same_as_single(results, reference(**body))
    finally:
        assert server.terminate() == 0
