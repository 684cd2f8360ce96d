"""Prometheus metrics of one server, in its own registry (no process-wide state).

Per question (histograms, finish reasons): observed once, when its result reaches this server,
from the result's own fields (queue_ms, ttft_ms, tpot_ms, elapsed_ms, tokens). In distributed
mode that is the router, after the aggregator has kept one answer per question, so a
question is counted once whichever worker answered it, and its times count from the
router's submit. Engine state (questions running / waiting, KV blocks) comes from an
EngineLoad read when /metrics is scraped: one engine's, the replicas' summed (multi_gpu), or
the live workers' summed from their heartbeats (distributed); the usage ratio is the sum
of blocks in use over the sum of blocks. Counts the engines keep (alerts, prefix cache)
are exported as counters of those totals; a cluster sums the last count of every worker
it has heard from, so they never go down when a worker leaves. Labels are small, fixed
sets (status, finish reason, isolation level, alert kind, route); never request ids.
Engine steps are folded in from EngineStats.recent at scrape time, so the step loop
never waits on us.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kev.results.result import Result
from kev.engine.stats import EngineLoad, StepRecord
from kev.errors import CONTEXT_OVERFLOW
from kev.engine.kv.audit import ISOLATION_ALERTS, OTHER_ALERTS
from kev.backend.vllm_metrics import VllmMetrics

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


ALERT_KINDS = ISOLATION_ALERTS + OTHER_ALERTS


def reject_reason(result: Result) -> str | None:
    """A question refused for the caller's input (its error names the caller's field): a reject, never an alert."""
    if result.status != "error" or result.error_field is None:
        return None
    return "context_overflow" if CONTEXT_OVERFLOW in (result.error or "") else "invalid_question"


class ServerMetrics:
    def __init__(self, model_name: str = "kev", device: str = "auto") -> None:
        """device: core.device, where a cluster's workers keep their KV cache (an engine here says its own)."""
        self.device = device
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter("kev_http_requests", "HTTP requests answered", ["route", "method", "status"],
                                     registry=r)
        self.requests = Counter("kev_requests", "requests submitted to the engine", ["api"], registry=r)
        self.questions = Counter("kev_questions", "questions finished", ["status", "finish_reason"], registry=r)
        self.finished = Counter("kev_questions_finished", "questions finished, by isolation level and finish reason",
                                ["isolation", "finish_reason"], registry=r)
        self.channel_questions = Counter("kev_channel_questions",
                                         "questions finished per channel (status=rejected: rejects)",
                                         ["channel_id", "status"], registry=r)
        self.bucket_questions = Counter("kev_hash_bucket_questions", "questions finished per router hash bucket",
                                        ["hash_bucket", "status"], registry=r)
        self.prompt_tokens = Counter("kev_prompt_tokens", "prompt tokens of finished questions", registry=r)
        self.completion_tokens = Counter("kev_completion_tokens", "completion tokens of finished questions", registry=r)
        self.channel_tokens = Counter("kev_channel_completion_tokens", "completion tokens per channel", ["channel_id"],
                                      registry=r)
        self.rejects = Counter("kev_rejects", "requests and questions refused: for lack of capacity (unavailable, "
                               "server_busy, overflow_*, wait_timeout) or for the caller's input (context_overflow, "
                               "invalid_question)", ["reason"], registry=r)
        self.question_seconds = Histogram("kev_question_seconds", "a question's time in its channel", buckets=_SECONDS,
                                          registry=r)
        self.ttft = Histogram("kev_time_to_first_token_seconds", "submit to first token of a question, queue included",
                              buckets=_LATENCY, registry=r)
        self.e2e = Histogram("kev_e2e_request_latency_seconds", "submit to end of a question, queue included",
                             buckets=_LATENCY, registry=r)
        self.tpot = Histogram("kev_time_per_output_token_seconds", "time between two output tokens of a question "
                              "(each gap after the first token counts once, at its question's mean)",
                              buckets=_PER_TOKEN, registry=r)
        self.queue_time = Histogram("kev_queue_time_seconds", "submit to start in a channel", buckets=_LATENCY,
                                    registry=r)
        self.question_prompt_tokens = Histogram("kev_question_prompt_tokens", "prompt tokens of one question",
                                                buckets=_TOKENS, registry=r)
        self.question_generation_tokens = Histogram("kev_question_generation_tokens",
                                                    "generated tokens of one question", buckets=_TOKENS, registry=r)
        self.steps = Counter("kev_engine_steps", "engine steps (one forward each)", registry=r)
        self.step_seconds = Histogram("kev_step_seconds", "time of one engine step", buckets=_SECONDS, registry=r)
        self.step_channels = Histogram("kev_step_channels", "channels in one forward (batch size)", buckets=_SIZES,
                                       registry=r)
        self.step_tokens = Histogram("kev_step_tokens", "tokens computed in one forward", buckets=_SIZES, registry=r)
        self.queue_length = Gauge("kev_queue_length", "questions waiting for a channel", registry=r)
        self.running = Gauge("kev_questions_running", "questions in a channel now (prefill or decode)", registry=r)
        self.waiting = Gauge("kev_questions_waiting", "questions not started yet (channel queues, overflow FIFO, "
                             "and in distributed mode the work stream)", registry=r)
        self.kv_usage = Gauge("kev_kv_cache_usage_ratio", "KV blocks in use / KV blocks in the pool (0-1)", registry=r)
        self.kv_free = Gauge("kev_kv_blocks_free", "KV blocks free", registry=r)
        self.kv_total = Gauge("kev_kv_blocks_total", "KV blocks in the pool", registry=r)
        self.channels = Gauge("kev_channels", "channels by state", ["state"], registry=r)
        self.inflight = Gauge("kev_inflight_requests", "HTTP requests being answered or streamed", registry=r)
        self.totals = EngineTotals(model_name)
        r.register(self.totals)
        self.vllm = VllmMetrics(r, model_name)  # the same quantities under vLLM's names, for its dashboards
        self._last_step: StepRecord | None = None

    def observe_result(self, result: Result) -> None:
        self.vllm.observe(result)
        reason = reject_reason(result)
        if reason is not None:
            self.rejects.labels(reason).inc()
        status, channel = result.status, str(result.channel_id) if result.channel_id is not None else "none"
        reason = result.finish_reason or "none"
        self.questions.labels(status, reason).inc()
        self.finished.labels(result.isolation, reason).inc()
        self.channel_questions.labels(channel, status).inc()
        bucket = getattr(result, "hash_bucket", None)
        self.bucket_questions.labels(str(bucket) if bucket is not None else "none", status).inc()
        self.prompt_tokens.inc(result.prompt_tokens)
        self.completion_tokens.inc(result.completion_tokens)
        self.channel_tokens.labels(channel).inc(result.completion_tokens)
        self.question_prompt_tokens.observe(result.prompt_tokens)
        self.question_generation_tokens.observe(result.completion_tokens)
        if result.elapsed_ms:
            self.question_seconds.observe(result.elapsed_ms / 1000)
        self.queue_time.observe(result.queue_ms / 1000)
        self.e2e.observe((result.queue_ms + result.elapsed_ms) / 1000)
        if result.ttft_ms is not None:
            self.ttft.observe(result.ttft_ms / 1000)
        if result.tpot_ms is not None:  # one observation per gap: rate(sum) / rate(count) is the mean over tokens
            for _ in range(result.completion_tokens - 1):
                self.tpot.observe(result.tpot_ms / 1000)

    def refresh(self, recent: list[StepRecord], channel_states: list[dict[str, Any]], queue_length: int,
                alert_counts: dict[str, int], load: EngineLoad | None = None) -> None:
        """Fold the steps since the last scrape into the histograms; set the gauges and the engine totals."""
        load = load or EngineLoad()
        self.totals.alerts = {kind: alert_counts.get(kind, 0) for kind in ALERT_KINDS}
        self.totals.load = load
        for record in _after(recent, self._last_step):
            self.steps.inc()
            self.step_seconds.observe(record.step_ms / 1000)
            self.step_channels.observe(record.num_channels)
            self.step_tokens.observe(record.num_tokens)
        if recent:
            self._last_step = recent[-1]
        self.queue_length.set(queue_length)
        self.running.set(load.num_running)
        self.waiting.set(load.num_waiting)
        self.kv_usage.set(load.kv_usage)
        self.vllm.set_load(load)
        self.kv_free.set(load.kv_blocks_total - load.kv_blocks_used)
        self.kv_total.set(load.kv_blocks_total)
        counts = {"idle": 0, "prefill": 0, "decode": 0}
        for channel in channel_states:
            counts[channel["state"]] = counts.get(channel["state"], 0) + 1
        for state, count in counts.items():
            self.channels.labels(state).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class EngineTotals(Collector):
    """Counters whose totals the engines keep (the audit's alerts, the loose prefix cache): exported as they
    were last read, so the count has one home and a scrape never double-counts."""

    def __init__(self, model_name: str = "kev") -> None:
        self.alerts: dict[str, int] = {kind: 0 for kind in ALERT_KINDS}
        self.load = EngineLoad()
        self.model_name = model_name

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        alerts = CounterMetricFamily("kev_isolation_alerts", "audit alerts raised by the engines since start, by kind",
                                     labels=["kind"])
        for kind, count in self.alerts.items():
            alerts.add_metric([kind], count)
        yield alerts
        yield CounterMetricFamily("kev_prefix_cache_queries", "loose-level prefix cache lookups across requests "
                                  "(the declared public prefix, or a tenant's own)", value=self.load.prefix_queries)
        yield CounterMetricFamily("kev_prefix_cache_hits", "loose-level prefix cache lookups that found the prefix's "
                                  "K/V already there (no prefill)", value=self.load.prefix_hits)
        yield from _per_tenant(self.load.prefix_by_tenant)
        yield from _spec_decode(self.load, self.model_name)


def _spec_decode(load: EngineLoad, model_name: str) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Prompt-lookup drafts under vLLM's spec-decode names (its dashboards' acceptance panels read them)."""
    for name, doc, value in (
            ("vllm:spec_decode_num_drafts", "verify steps a question took with a draft", load.spec_drafts),
            ("vllm:spec_decode_num_draft_tokens", "tokens drafted", load.spec_draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", "drafted tokens the model sampled itself",
             load.spec_accepted_tokens)):
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        yield family
    rate = GaugeMetricFamily("kev_spec_decode_acceptance_rate", "accepted / drafted tokens since start (0: none "
                             "drafted)", value=load.acceptance_rate)
    yield rate


def _per_tenant(counts: dict[str, tuple[int, int]]) -> Iterator[CounterMetricFamily]:
    """The prefix cache's counters by the tenant that looked (/metrics is the operator's: docs/security.md)."""
    queries = CounterMetricFamily("kev_prefix_cache_tenant_queries", "loose-level prefix cache lookups by the "
                                  "requests of one tenant", labels=["tenant"])
    hits = CounterMetricFamily("kev_prefix_cache_tenant_hits", "... those that found the K/V already there (a "
                               "public prefix, or one of the same tenant)", labels=["tenant"])
    for tenant, (num_queries, num_hits) in sorted(counts.items()):
        queries.add_metric([tenant], num_queries)
        hits.add_metric([tenant], num_hits)
    yield queries
    yield hits


def _after(recent: list[StepRecord], last: StepRecord | None) -> list[StepRecord]:
    """The records newer than `last` (all of them if `last` already fell out of the window)."""
    if last is None:
        return recent
    for i in range(len(recent) - 1, -1, -1):
        if recent[i] is last:
            return recent[i + 1:]
    return recent
