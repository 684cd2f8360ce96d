"""The quantities Kev measures, also under vLLM's metric names and labels, so vLLM's Grafana dashboards and alerts
work against Kev unchanged (beside Kev's own kev_* names, which stay).

Every series carries model_name (the served name, as vLLM's). Only what Kev has the same quantity for: a
question is vLLM's request (each channel's answer is one sequence), its times come from the result's own fields
(queue_ms, ttft_ms, tpot_ms, elapsed_ms), so prefill time is first token minus queue and decode time the rest.
vLLM's older names that its published dashboard still queries (gpu_cache_usage_perc, time_per_output_token_seconds)
are exported too, and what its dashboard reads of vLLM's swap-era engine: vllm:num_requests_swapped (always 0:
a Kev channel's KV blocks are never swapped out), vllm:cpu_cache_usage_perc (the KV use when the KV cache lives in
CPU memory, core.device cpu; 0 on a GPU, where nothing is kept in CPU memory) and
vllm:request_max_num_generation_tokens (each question's max_tokens as asked, observed when it is submitted).
Not exported: vllm:num_preemptions_total (Kev never preempts a channel). examples/vllm-dashboard-queries.md lists
the queries.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kev.results.result import Result
from kev.engine.stats import EngineLoad

_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0, 160.0, 640.0, 2560.0)  # vLLM's buckets for its request times
_PER_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
FINISHED_REASONS = ("stop", "length", "abort")


class VllmMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        labels, r = ["model_name"], registry
        gauge = lambda name, doc: Gauge(name, doc, labels, registry=r).labels(model_name)  # noqa: E731
        hist = lambda name, doc, buckets: Histogram(name, doc, labels, buckets=buckets,  # noqa: E731
                                                    registry=r).labels(model_name)
        self.running = gauge("vllm:num_requests_running", "questions in a channel now (kev_questions_running)")
        self.waiting = gauge("vllm:num_requests_waiting", "questions not started yet (kev_questions_waiting)")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV blocks in use / KV blocks (0-1)")
        self.gpu_kv_usage = gauge("vllm:gpu_cache_usage_perc", "vLLM's older name of vllm:kv_cache_usage_perc")
        self.cpu_kv_usage = gauge("vllm:cpu_cache_usage_perc", "KV blocks in use / KV blocks when the KV cache is in "
                                  "CPU memory (core.device cpu), else 0")
        self.swapped = gauge("vllm:num_requests_swapped", "questions swapped out: always 0 (Kev never swaps a "
                             "channel's KV blocks out)")
        self.kv_on_cpu = False  # set once the engine says where its KV cache lives
        self.ttft = hist("vllm:time_to_first_token_seconds", "submit to first token, queue included", _LATENCY)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "submit to end of a question", _LATENCY)
        self.itl = hist("vllm:inter_token_latency_seconds", "time between two output tokens", _PER_TOKEN)
        self.tpot = hist("vllm:time_per_output_token_seconds", "vLLM's older name of inter_token_latency", _PER_TOKEN)
        self.queue = hist("vllm:request_queue_time_seconds", "submit to start in a channel", _LATENCY)
        self.prefill = hist("vllm:request_prefill_time_seconds", "start in a channel to first token", _LATENCY)
        self.decode = hist("vllm:request_decode_time_seconds", "first token to end", _LATENCY)
        self.inference = hist("vllm:request_inference_time_seconds", "time in a channel (prefill + decode)", _LATENCY)
        self.prompt_lengths = hist("vllm:request_prompt_tokens", "prompt tokens of one question", _TOKENS)
        self.generation_lengths = hist("vllm:request_generation_tokens", "generated tokens of one question", _TOKENS)
        self.max_generation = hist("vllm:request_max_num_generation_tokens", "max_tokens one question asked for "
                                   "(observed at submit)", _TOKENS)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens of finished questions", labels,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "generated tokens of finished questions", labels,
                                         registry=r).labels(model_name)
        self.success = Counter("vllm:request_success", "finished questions by finished_reason (stop, length; abort: "
                               "Kev's timeout, cancelled and error)", ["model_name", "finished_reason"], registry=r)
        for reason in FINISHED_REASONS:  # every series exists from the start, as vLLM's do
            self.success.labels(model_name, reason)

    def observe(self, result: Result) -> None:
        reason = result.finish_reason if result.finish_reason in ("stop", "length") else "abort"
        self.success.labels(self.model_name, reason).inc()
        self.prompt_tokens.inc(result.prompt_tokens)
        self.generation_tokens.inc(result.completion_tokens)
        self.prompt_lengths.observe(result.prompt_tokens)
        self.generation_lengths.observe(result.completion_tokens)
        self.queue.observe(result.queue_ms / 1000)
        self.inference.observe(result.elapsed_ms / 1000)
        self.e2e.observe((result.queue_ms + result.elapsed_ms) / 1000)
        if result.ttft_ms is not None:
            self.ttft.observe(result.ttft_ms / 1000)
            self.prefill.observe(max(0.0, result.ttft_ms - result.queue_ms) / 1000)
            self.decode.observe(max(0.0, result.queue_ms + result.elapsed_ms - result.ttft_ms) / 1000)
        if result.tpot_ms is not None:
            for _ in range(result.completion_tokens - 1):
                self.itl.observe(result.tpot_ms / 1000)
                self.tpot.observe(result.tpot_ms / 1000)

    def set_load(self, load: EngineLoad) -> None:
        self.running.set(load.num_running)
        self.waiting.set(load.num_waiting)
        self.kv_usage.set(load.kv_usage)
        self.gpu_kv_usage.set(load.kv_usage)  # its older name of the KV use, wherever the KV cache is
        self.cpu_kv_usage.set(load.kv_usage if self.kv_on_cpu else 0.0)
        self.swapped.set(0)

    def observe_asked(self, max_tokens: int) -> None:
        self.max_generation.observe(max_tokens)
