"""core.tensor_parallel 2 on the CPU (two processes, gloo): logits as tensor_parallel 1's within 1e-5 relative in fp32,
every packed answer bit-identical to the same question alone under tensor_parallel 2, multi_gpu replicas made of rank
groups, and a rank that dies fails the questions in flight with a clear error instead of hanging."""
from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from harness import ServerProcess

import kev
from kev.engine.engine_setup import build_parts
from kev.engine.tp_runner import TensorParallelRunner
from kev.errors import UnavailableError

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France? Answer in one word.",
    "解释一下注意力机制",
    "Hi",
    "Summarise in two sentences why the sky looks blue during the day and red at sunset, "
    "mentioning Rayleigh scattering and the path length of sunlight through the atmosphere.",
    "1+1=?",
]
MAX_TOKENS = 8
# A small prefill chunk: the long question is cut into several chunks.
OVERRIDES = {"core": {"prefill_chunk": 16, "max_step_tokens": 64},
             "router": {"max_parallel_queries": 8, "channel_pool_size": 8}}
TP2 = {**OVERRIDES, "core": {**OVERRIDES["core"], "tensor_parallel": 2}}


def tp_engine(default_model: Any, overrides: dict[str, Any], background: bool = True) -> kev.Engine:
    config = kev.load_config({"router": {"default_timeout_ms": 600_000, "strategy": "round_robin"},
                              "core": {"precision": "fp32"}}, overrides)
    model, tokenizer = default_model
    return kev.Engine(config, build_parts(config, model, tokenizer), record_logits=True, background=background)


@pytest.fixture(scope="module")
def engine(default_model: Any) -> Iterator[kev.Engine]:
    engine = tp_engine(default_model, TP2)
    assert isinstance(engine.runner, TensorParallelRunner)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def solo(engine: kev.Engine) -> dict[str, Any]:
    return {q: engine.generate([q], max_tokens=MAX_TOKENS, timeout=300)[0] for q in QUESTIONS}


def test_logits_match_tensor_parallel_1(make_engine: Callable[..., kev.Engine], solo: dict[str, Any]) -> None:
    single = make_engine(OVERRIDES, record_logits=True)
    for question in QUESTIONS:
        reference, split = single.generate([question], max_tokens=MAX_TOKENS, timeout=300)[0], solo[question]
        assert split.status == "ok", split.error
        assert split.token_ids == reference.token_ids, question
        scale = reference.logits.abs().max()
        worst = (split.logits - reference.logits).abs().max()
        assert worst <= 1e-5 * scale, f"{question!r}: max |Δlogit| {worst:.3g} vs scale {scale:.3g}"
    assert split.numerics_fingerprint != reference.numerics_fingerprint, "the rank count is part of the numerics"


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_batch_equals_solo_under_tensor_parallel_2(engine: kev.Engine, solo: dict[str, Any], seed: int) -> None:
    order = QUESTIONS[:]
    random.Random(seed).shuffle(order)
    results = engine.generate(order, max_tokens=MAX_TOKENS, timeout=300)
    assert len({r.channel_id for r in results}) == len(order), "each question has its own channel"
    for question, result in zip(order, results):
        reference = solo[question]
        assert result.status == "ok", result.error
        assert result.token_ids == reference.token_ids, question
        assert torch.equal(result.logits, reference.logits), f"logits differ for {question!r}"


def test_more_ranks_than_key_value_heads_is_a_config_error(default_model: Any) -> None:
    with pytest.raises(kev.ConfigError, match=r"core\.tensor_parallel \(4\).*3 key/value heads"):
        tp_engine(default_model, {"core": {"tensor_parallel": 4}})


def test_block_weights_are_a_config_error_and_auto_keeps_floats() -> None:
    from kev.engine.engine_setup import load_model_and_tokenizer
    from kev.model.tensor_parallel import check_shardable

    model, _ = load_model_and_tokenizer(kev.load_config({"core": {"precision": "gguf", "max_context": 64}}))
    with pytest.raises(kev.ConfigError, match=r"core\.tensor_parallel: core\.precision gguf and w8a8 hold"):
        check_shardable(model, 2)
    assert kev.load_config({"core": {"tensor_parallel": 2}}).core.resolved_precision != "gguf"


def test_multi_gpu_replica_is_a_rank_group(solo: dict[str, Any]) -> None:
    from kev.engine.replicas import ReplicaEngine

    config = kev.load_config({"deploy": {"mode": "multi_gpu", "devices": ["cpu", "cpu"]},
                              "core": {**TP2["core"], "precision": "fp32"},
                              "router": {**TP2["router"], "default_timeout_ms": 600_000}})
    replicas = ReplicaEngine(config)
    try:
        assert len(replicas.replicas) == 1 and isinstance(replicas.replicas[0].runner, TensorParallelRunner)
        result = replicas.generate([QUESTIONS[0]], max_tokens=MAX_TOKENS, timeout=300)[0]
        assert result.token_ids == solo[QUESTIONS[0]].token_ids
        assert result.worker == "replica0:cpu+cpu"
    finally:
        replicas.close()


def test_a_dead_rank_fails_the_questions_in_flight(default_model: Any) -> None:
    engine = tp_engine(default_model, TP2)
    try:
        assert isinstance(engine.runner, TensorParallelRunner)
        request_id = engine.submit(["Count from one to one thousand."], max_tokens=400, ignore_eos=True)
        deadline = time.monotonic() + 120
        while engine.num_steps < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        engine.runner.followers[0].process.kill()
        started = time.monotonic()
        result = engine.wait(request_id, timeout=60)[0]
        assert time.monotonic() - started < 30, "a dead rank is noticed at once, not after the collective timeout"
        assert result.status == "error"
        assert "tensor-parallel rank 1" in (result.error or "") and "exited with code -9" in (result.error or "")
        assert engine.failure is not None and "rank 1" in engine.failure
        with pytest.raises(UnavailableError, match="tensor-parallel rank 1"):
            engine.submit(["Hi"])
    finally:
        engine.close()


def test_kev_serve_exits_non_zero_when_a_rank_dies(tmp_path: Path) -> None:
    server = ServerProcess({"core": {"tensor_parallel": 2, "precision": "fp32"}}, tmp_path).start()
    try:
        body = {"model": "smollm2-135m-instruct", "prompt": "The capital of France is", "max_tokens": 4}
        answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert server.proc is not None
        children = [pid for task in Path(f"/proc/{server.proc.pid}/task").iterdir()
                    for pid in (task / "children").read_text().split()]  # the loader thread started them
        followers = [int(pid) for pid in children
                     if b"kev.engine.tp_follower" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(followers) == 1
        os.kill(followers[0], signal.SIGKILL)  # while idle: the server notices without a request
        assert server.proc.wait(60) == 2
        assert "tensor-parallel rank 1" in server.log() and "exited with code -9" in server.log()
    finally:
        server.kill()


def test_int8_weights_split_too_and_packed_equals_solo() -> None:
    """core.precision int8 under tensor_parallel 2: int8 rows split with their scales, a batch changes no bit."""
    config = kev.load_config({"router": {"default_timeout_ms": 600_000, "strategy": "round_robin"},
                              "core": {"precision": "int8"}}, TP2)
    with kev.Engine(config, record_logits=True) as engine:
        assert isinstance(engine.runner, TensorParallelRunner)
        solo = [engine.generate([q], max_tokens=MAX_TOKENS, timeout=300)[0] for q in QUESTIONS[:3]]
        packed = engine.generate(QUESTIONS[:3], max_tokens=MAX_TOKENS, timeout=300)
    for alone, together in zip(solo, packed):
        assert alone.status == together.status == "ok", (alone.error, together.error)
        assert together.token_ids == alone.token_ids and torch.equal(together.logits, alone.logits)
