"""The server's pure parts, without a server: error fields, limits, registry expiry, metrics folding, formats."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

import kev
from kev.results.result import Result
from kev.engine.stats import EngineLoad, StepRecord
from kev.wire.bodies.api_models import QueryBody
from kev.wire.bodies.errors import ApiError, field_path, validation_error
from kev.wire.limits import Limits
from kev.backend.metrics import ServerMetrics
from kev.wire.openai_format import Reply, finish_reason
from kev.server.registry import RequestRegistry, Tracked
from kev.server.sse import sse
from kev.backend.watch import Watch


def error_for(body: dict) -> ApiError:
    try:
        QueryBody.model_validate(body)
    except ValidationError as err:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in err.errors()]
        return validation_error(RequestValidationError(errors))
    raise AssertionError("body was valid")


@pytest.mark.parametrize(("loc", "path"), [
    (("body", "queries", 0, "as_object", "text"), "queries[0].text"),
    (("body", "queries", 2, "as_messages", 1, "role"), "queries[2][1].role"),
    (("body", "stop", "function-after[_encodable(), str]"), "stop"),
    (("body",), "body"),
    (("query", "limit"), "limit"),
])
def test_field_path_drops_union_labels(loc: tuple, path: str) -> None:
    assert field_path(loc) == path


@pytest.mark.parametrize(("body", "field"), [
    ({"queries": [{"messages": [{"role": "user", "content": 3}]}]}, "queries[0].messages[0].content"),
    ({"queries": ["a"], "max_tokens": "8"}, "max_tokens"),
    ({"queries": [7]}, "queries[0]"),
    ({}, "queries"),
])
def test_validation_error_names_the_deepest_field(body: dict, field: str) -> None:
    err = error_for(body)
    assert (err.status_code, err.field) == (422, field)
    assert err.message.startswith(f"{field}: ")


@pytest.mark.parametrize(("body", "message"), [
    ({"queries": ["a"], "temperature": float("nan")}, "temperature: Input should be a finite number"),
    ({"queries": ["a"], "top_p": float("inf")}, "top_p: Input should be a finite number"),
    ({"queries": ["a"], "stop": ["x"] * 10_000}, "stop: List should have at most 16 items"),
])
def test_validation_error_names_the_rule_broken(body: dict, message: str) -> None:
    """Issue 24: NaN was told "should be <= 100", and 10,000 stop strings "should be a valid string"."""
    assert error_for(body).message.startswith(message)


def test_limits_name_field_and_limit() -> None:
    limits = Limits.from_config(kev.load_config({"server": {"max_questions": 2, "max_question_chars": 5,
                                                            "max_tokens_cap": 10},
                                                "router": {"max_tokens_cap": 8, "default_max_tokens": 8}}))
    assert limits.max_tokens_cap == 8, "the server cap never exceeds the engine's"
    lower = Limits.from_config(kev.load_config({"server": {"max_tokens_cap": 4}}))
    assert (lower.max_tokens_cap, lower.default_max_tokens) == (4, 4), "the default obeys the server cap"
    cases = [({"queries": ["a", "b", "c"]}, 413, "queries", "max_questions=2"),
             ({"queries": ["a", "bbbbbb"]}, 422, "queries[1]", "max_question_chars=5"),  # one string: maxLength
             ({"queries": [[{"role": "user", "content": "bbb"}] * 2]}, 413, "queries[0]", "max_question_chars=5"),
             ({"queries": [{"text": "a", "max_tokens": 9}]}, 422, "queries[0].max_tokens", "max_tokens_cap=8")]
    for body, status, field_name, limit in cases:
        with pytest.raises(ApiError) as refused:
            limits.check_submit(QueryBody.model_validate(body))
        assert (refused.value.status_code, refused.value.field) == (status, field_name)
        assert limit in refused.value.message
    limits.check_submit(QueryBody.model_validate({"queries": ["abcde", [{"role": "user", "content": "ab"}]]}))


def test_unknown_server_key_is_a_config_error_naming_it() -> None:
    with pytest.raises(kev.ConfigError, match="kev.server.prot"):
        kev.load_config({"server": {"prot": 1}})


@dataclass
class FakeWatch:
    done: threading.Event = field(default_factory=threading.Event)
    finished_at: float | None = None

    def finish(self, at: float) -> None:
        self.finished_at = at
        self.done.set()


def test_registry_bounds_in_flight_and_forgets_expired() -> None:
    registry = RequestRegistry(max_inflight=2, ttl_s=10.0, max_retained=1)
    assert registry.reserve() and registry.reserve() and not registry.reserve()
    watches = {rid: FakeWatch() for rid in ("a", "b", "c")}
    registry.unreserve(), registry.unreserve()
    for rid, watch in watches.items():
        registry.add(Tracked(rid, watch, retained=True))  # type: ignore[arg-type]
    assert registry.num_inflight == 3 and registry.unfinished() == ["a", "b", "c"]
    watches["a"].finish(100.0)
    watches["b"].finish(105.0)
    assert registry.num_inflight == 1
    assert registry.expired(now=106.0) == ["a"], "one retained at most: the oldest goes first"
    assert registry.expired(now=116.0) == ["a", "b"], "past the time to live"
    registry.remove("a")
    assert registry.get("a") is None and registry.get("b") is not None


def test_metrics_fold_each_step_once() -> None:
    metrics = ServerMetrics()
    steps = [StepRecord(float(i), 2, 10, 2, 50.0) for i in range(3)]
    metrics.refresh(steps, [{"state": "idle"}, {"state": "decode"}], 4, {})
    metrics.refresh(steps + [StepRecord(3.0, 4, 4, 4, 20.0)], [], 0, {"cross_channel_visible": 2})
    registry = metrics.registry
    assert registry.get_sample_value("kev_engine_steps_total") == 4
    assert registry.get_sample_value("kev_step_channels_sum") == 10
    assert registry.get_sample_value("kev_queue_length") == 0
    metrics.observe_result(Result("r", 0, completion_tokens=3, prompt_tokens=5, channel_id=1, status="ok",
                                  finish_reason="length", isolation_verified=False))
    assert registry.get_sample_value("kev_channel_questions_total", {"channel_id": "1", "status": "ok"}) == 1
    assert registry.get_sample_value("kev_isolation_alerts_total", {"kind": "cross_channel_visible"}) == 2
    assert registry.get_sample_value("kev_isolation_alerts_total", {"kind": "shadow_mismatch"}) == 0
    assert b"kev_completion_tokens_total 3.0" in metrics.render()
    assert b"# TYPE kev_isolation_alerts_total counter" in metrics.render(), "a counter, under the name the docs give"


def test_latency_histograms_come_from_the_result_fields() -> None:
    metrics = ServerMetrics()
    metrics.observe_result(Result("r", 0, prompt_tokens=7, completion_tokens=5, status="ok", finish_reason="stop",
                                  isolation="loose", queue_ms=200.0, elapsed_ms=1300.0, ttft_ms=500.0, tpot_ms=250.0))
    metrics.observe_result(Result("r", 1, status="error", finish_reason="error", error="bad question"))
    value = metrics.registry.get_sample_value
    assert value("kev_time_to_first_token_seconds_count") == 1, "no first token, no TTFT sample"
    assert value("kev_time_to_first_token_seconds_sum") == pytest.approx(0.5)
    assert value("kev_e2e_request_latency_seconds_sum") == pytest.approx(1.5), "queue included"
    assert value("kev_e2e_request_latency_seconds_count") == 2
    assert value("kev_queue_time_seconds_sum") == pytest.approx(0.2)
    # 5 tokens: 4 gaps of 250 ms; the mean over tokens is rate(sum) / rate(count)
    assert value("kev_time_per_output_token_seconds_count") == 4
    assert value("kev_time_per_output_token_seconds_sum") == pytest.approx(1.0)
    assert value("kev_question_prompt_tokens_sum") == 7 and value("kev_question_generation_tokens_count") == 2
    assert value("kev_questions_finished_total", {"isolation": "loose", "finish_reason": "stop"}) == 1
    assert value("kev_questions_finished_total", {"isolation": "strict", "finish_reason": "error"}) == 1


def test_engine_load_gauges_and_prefix_counters() -> None:
    metrics = ServerMetrics()
    # two engines of different sizes: the ratio is of the sums, not the mean of the two ratios
    load = EngineLoad(2, 3, 10, 100, 4, 3) + EngineLoad(1, 0, 30, 40, 2, 2)
    metrics.refresh([], [], 3, {}, load)
    value = metrics.registry.get_sample_value
    assert value("kev_kv_cache_usage_ratio") == pytest.approx(40 / 140)
    assert value("kev_kv_blocks_free") == 100 and value("kev_kv_blocks_total") == 140
    assert value("kev_questions_running") == 3 and value("kev_questions_waiting") == 3
    assert value("kev_prefix_cache_queries_total") == 6 and value("kev_prefix_cache_hits_total") == 5


def test_openai_usage_counts_each_prompt_once() -> None:
    results = [Result("r", i, prompt_tokens=10 + i // 2, completion_tokens=3, finish_reason="stop" if i else "timeout")
               for i in range(4)]
    usage = Reply("text", "cmpl-r", 0, "m", n=2).usage(results)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (21, 12, 33)
    assert [finish_reason(r) for r in results] == ["timeout", "stop", "stop", "stop"]


@pytest.mark.parametrize("reason", ["stop", "length", "timeout", "cancelled"])
def test_openai_finish_reason_never_calls_a_cut_answer_length(reason: str) -> None:
    result = Result("r", 0, text="partial", finish_reason=reason)  # type: ignore[arg-type]
    assert finish_reason(result) == reason
    chunk = Reply("chat", "chatcmpl-r", 0, "m", 1).response([result]).model_dump()
    assert chunk["choices"][0]["finish_reason"] == reason and chunk["choices"][0]["message"]["content"] == "partial"


def test_sse_frames_one_line_of_json() -> None:
    assert sse({"text": "a\nb"}, "delta") == 'event: delta\ndata: {"text": "a\\nb"}\n\n'
    assert sse("[DONE]") == "data: [DONE]\n\n"


class RefusingEngine:
    """Stands in for an engine whose submit() refuses, as the overflow policies will."""

    failure: str | None = None

    def __init__(self, error: Exception) -> None:
        self.error = error

    def subscribe(self, listener: object) -> None:
        pass

    def submit(self, queries: list, sampling: object = None, **options: object) -> str:
        raise self.error


@pytest.mark.parametrize(("error", "status", "field", "retry_after"), [
    (kev.RejectedError("channel pool full (overflow_policy: reject)"), 429, None, "1"),
    (TimeoutError("no channel free after 5s"), 503, None, "1"),
    (kev.InvalidRequestError("max_parallel: must be a positive integer, got 0"), 422, "max_parallel", None),
])
def test_engine_refusals_map_to_http(error: Exception, status: int, field: str | None, retry_after: str | None) -> None:
    import asyncio

    from kev.engine.sampling_params import SamplingParams
    from kev.backend.bridge import EngineBridge
    from kev.server.service import KevService

    service = KevService(kev.load_config({}), ServerMetrics())
    bridge = EngineBridge(RefusingEngine(error), service.metrics, 4)  # type: ignore[arg-type]
    service.attach(bridge)
    with pytest.raises(ApiError) as refused:
        asyncio.run(service.submit(["q"], SamplingParams(), {}, "query", tenant="default"))
    bridge.pool.shutdown()
    assert (refused.value.status_code, refused.value.field) == (status, field)
    assert (refused.value.headers or {}).get("Retry-After") == retry_after
    assert service.registry.num_inflight == 0, "a refused submission gives its slot back"


def test_the_published_schema_holds_the_servers_limits() -> None:
    """Issue 24: the schema was looser than the server's checks (a schema-valid body refused)."""
    from kev.server.app import build_app

    config = kev.load_config({"server": {"max_questions": 3, "max_question_chars": 64, "max_tokens_cap": 4,
                                         "max_timeout_ms": 5000}})
    schemas = build_app(config).openapi()["components"]["schemas"]
    queries = schemas["QueryBody"]["properties"]["queries"]
    assert queries["maxItems"] == 3 and queries["items"]["oneOf"][0]["maxLength"] == 64
    assert schemas["QuestionObject"]["properties"]["text"]["maxLength"] == 64
    assert schemas["ChatMessage"]["properties"]["content"]["maxLength"] == 64
    assert schemas["ChatCompletionBody"]["properties"]["n"]["maximum"] == 3
    assert schemas["CompletionBody"]["properties"]["max_tokens"]["anyOf"][0]["maximum"] == 4
    assert schemas["QueryBody"]["properties"]["timeout_ms"]["anyOf"][0]["maximum"] == 5000
    assert "maxLength" not in schemas["ResultModel"]["properties"]["text"], "responses are not limited"
    assert schemas["QueryBody"]["allOf"][0]["then"] == {"properties": {"prompt_logprobs": {"const": True}},
                                            "required": ["prompt_logprobs"]}  # max_tokens 0: scoring only
    temperature = schemas["QueryBody"]["properties"]["temperature"]["anyOf"]
    assert temperature[:2] == [{"type": "number", "enum": [0]}, {"type": "number", "maximum": 100.0, "minimum": 0.001}]


def test_a_file_system_refusal_is_a_503_naming_the_path(tmp_path) -> None:
    """Issue 37: a full disk or a read-only batch.dir in a route is the resource's fault, not a 500 traceback."""
    import errno

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from kev.batch.store import BatchStore
    from kev.server.errors import install_handlers

    app = FastAPI()
    install_handlers(app)

    @app.get("/full")
    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "files" / "x.data"))

    response = TestClient(app).get("/full")
    assert response.status_code == 503 and response.headers["Retry-After"], response.text
    message = response.json()["error"]["message"]
    assert str(tmp_path / "files" / "x.data") in message and "no space left" in message, message
    (tmp_path / "file").write_text("")
    with pytest.raises(kev.ConfigError, match="batch.dir: .*file"):
        BatchStore(tmp_path / "file" / "batches")  # a path through a file: one line naming the setting


def test_each_tenant_has_its_share_of_in_flight_slots_and_retained_results() -> None:
    from kev.config.sharing_config import SharingConfig

    sharing, names = SharingConfig(), ["a", "b"]
    registry = RequestRegistry(4, 600.0, 4, lambda t: sharing.tenant_limit(None, 4, t, names),
                               lambda t: sharing.tenant_limit(None, 4, t, names))
    assert registry.reserve("b") and registry.reserve("b") and not registry.reserve("b"), "b's share is 2 of 4"
    assert "tenant 'b'" in (registry.full("b") or "") and registry.reserve("a"), "a is answered, not refused"
    registry.unreserve("b"), registry.unreserve("b"), registry.unreserve("a")
    loop = asyncio.new_event_loop()
    try:
        for i, tenant in enumerate(["a", "a"] + ["b"] * 20):
            watch = Watch(f"{tenant}{i}", 1, loop)
            watch.done.set()
            watch.finished_at = time.monotonic()
            registry.add(Tracked(f"{tenant}{i}", watch, True, tenant))
        gone = set(registry.expired())
    finally:
        loop.close()
    assert not {"a0", "a1"} & gone, "b's many async requests push out none of a's results"
    assert len([r for r in gone if r.startswith("b")]) == 18, "b keeps its newest 2"
