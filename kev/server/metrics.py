"""Prometheus metrics of one server, in its own registry (no process-wide state).

Results are counted as they finish (by the watcher threads); engine steps are folded in
from EngineStats.recent when /metrics is scraped, so the step loop never waits on us.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kev.aggregator.result import Result
from kev.engine.stats import StepRecord
from kev.isolation.audit import ISOLATION_ALERTS, OTHER_ALERTS

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


ALERT_KINDS = ISOLATION_ALERTS + OTHER_ALERTS


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter("kev_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=r)
        self.requests = Counter("kev_requests", "requests submitted to the engine", ["api"], registry=r)
        self.questions = Counter("kev_questions", "questions finished", ["status", "finish_reason"], registry=r)
        self.channel_questions = Counter("kev_channel_questions", "questions finished per channel (status=rejected: rejects)",
                                         ["channel_id", "status"], registry=r)
        self.bucket_questions = Counter("kev_hash_bucket_questions", "questions finished per router hash bucket",
                                        ["hash_bucket", "status"], registry=r)
        self.prompt_tokens = Counter("kev_prompt_tokens", "prompt tokens of finished questions", registry=r)
        self.completion_tokens = Counter("kev_completion_tokens", "completion tokens of finished questions", registry=r)
        self.channel_tokens = Counter("kev_channel_completion_tokens", "completion tokens per channel", ["channel_id"], registry=r)
        self.rejects = Counter("kev_rejects", "requests refused for lack of capacity", ["reason"], registry=r)
        self.isolation_alerts = Gauge("kev_isolation_alerts", "audit alerts raised by the engine since start, by kind",
                                      ["kind"], registry=r)
        self.question_seconds = Histogram("kev_question_seconds", "a question's time in its channel", buckets=_SECONDS, registry=r)
        self.steps = Counter("kev_engine_steps", "engine steps (one forward each)", registry=r)
        self.step_seconds = Histogram("kev_step_seconds", "time of one engine step", buckets=_SECONDS, registry=r)
        self.step_channels = Histogram("kev_step_channels", "channels in one forward (batch size)", buckets=_SIZES, registry=r)
        self.step_tokens = Histogram("kev_step_tokens", "tokens computed in one forward", buckets=_SIZES, registry=r)
        self.queue_length = Gauge("kev_queue_length", "questions waiting for a channel", registry=r)
        self.channels = Gauge("kev_channels", "channels by state", ["state"], registry=r)
        self.inflight = Gauge("kev_inflight_requests", "HTTP requests being answered or streamed", registry=r)
        self._last_step: StepRecord | None = None

    def observe_result(self, result: Result) -> None:
        status, channel = result.status, str(result.channel_id) if result.channel_id is not None else "none"
        self.questions.labels(status, result.finish_reason or "none").inc()
        self.channel_questions.labels(channel, status).inc()
        bucket = getattr(result, "hash_bucket", None)
        self.bucket_questions.labels(str(bucket) if bucket is not None else "none", status).inc()
        self.prompt_tokens.inc(result.prompt_tokens)
        self.completion_tokens.inc(result.completion_tokens)
        self.channel_tokens.labels(channel).inc(result.completion_tokens)
        if result.elapsed_ms:
            self.question_seconds.observe(result.elapsed_ms / 1000)

    def refresh(self, recent: list[StepRecord], channel_states: list[dict[str, Any]], queue_length: int,
                alert_counts: dict[str, int]) -> None:
        """Fold the steps since the last scrape into the histograms; set the gauges."""
        for kind in ALERT_KINDS:
            self.isolation_alerts.labels(kind).set(alert_counts.get(kind, 0))
        for record in _after(recent, self._last_step):
            self.steps.inc()
            self.step_seconds.observe(record.step_ms / 1000)
            self.step_channels.observe(record.num_channels)
            self.step_tokens.observe(record.num_tokens)
        if recent:
            self._last_step = recent[-1]
        self.queue_length.set(queue_length)
        counts = {"idle": 0, "prefill": 0, "decode": 0}
        for state in channel_states:
            counts[state["state"]] = counts.get(state["state"], 0) + 1
        for state, count in counts.items():
            self.channels.labels(state).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _after(recent: list[StepRecord], last: StepRecord | None) -> list[StepRecord]:
    """The records newer than `last` (all of them if `last` already fell out of the window)."""
    if last is None:
        return recent
    for i in range(len(recent) - 1, -1, -1):
        if recent[i] is last:
            return recent[i + 1:]
    return recent
