"""Routing under skewed traffic: round_robin vs semantic_hash vs consistent_hash vs length_aware.

The article's mix (2.1): 20% of the questions carry ~80% of the tokens. Long questions
(a support ticket to summarize, a long answer) arrive shuffled among short customer-service
questions, half of which are near-variants of "怎么退款" / "怎么修改地址" (the hot spot of 4.3).
All questions arrive at t=0 in a seeded order (one request, so every placement is decided
before the first step and the step schedule is deterministic); a question's latency is
submit → result, in seconds and in engine steps. Wall time on a shared machine is noisy;
step counts are not. One seeded recipe, one table:

    kev bench --scenario routing [--repeats 3] [--out bench/results/routing.md]
    python bench/routing_bench.py            # the same, without installing the CLI
"""
from __future__ import annotations

import argparse
import bisect
import os
import platform
import random
from collections.abc import Sequence
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOT = ["怎么退款", "嗯，怎么退款？", "请问怎么退款", "怎么退款！！！", "怎么申请退款", "你好，怎么退款",
       "亲，怎么退款？", "怎么退款啊", "怎么修改地址", "你好，怎么修改地址？", "怎么修改收货地址", "请问怎么修改地址",
       "嗯，怎么修改地址", "怎么改地址", "地址怎么修改", "怎么更改地址"]
VARIED = ["What is the capital of France?", "发票怎么开", "How do I reset my password?", "优惠券怎么用",
          "Who wrote Hamlet?", "订单什么时候发货", "Name a large mammal.", "会员有什么权益", "Why is the sea salty?",
          "客服几点下班", "List three prime numbers.", "可以开增值税发票吗", "What is 17 times 3?", "支持货到付款吗",
          "Give me a synonym for happy.", "运费怎么算"]
TICKET = ["The customer ordered a blue winter jacket in size M on the third of the month.",
          "The parcel was marked as delivered, but the customer says it never arrived.",
          "They contacted support twice by chat and once by phone without a resolution.",
          "The tracking page shows the parcel left the regional warehouse five days late.",
          "The customer asks for either a replacement in the same size or a full refund.",
          "They also mention that the discount code from the newsletter was not applied.",
          "A neighbour may have received the parcel, according to the courier's notes.",
          "The customer is a member of the loyalty programme and has ordered twelve times before.",
          "They would like an answer within two working days, before a trip abroad.",
          "The payment was made by credit card and the charge has already been settled."]
SHORT_MAX_TOKENS, LONG_MAX_TOKENS = 6, 32
SYSTEM = "Answer briefly."  # a short system prompt instead of the template's default
STRATEGIES = [("round_robin", {}), ("semantic_hash", {}), ("consistent_hash", {}), ("length_aware", {}),
              ("semantic_hash + breaker", {"strategy": "semantic_hash", "breaker_threshold": 2})]


@dataclass(frozen=True)
class Row:
    name: str
    total_s: float
    short_p50_ms: float
    short_p99_ms: float
    long_p50_ms: float
    busiest_share: float  # of the questions, on the busiest channel
    long_token_share: float
    total_steps: int
    short_p50_steps: float
    short_p99_steps: float


def traffic(seed: int = 0, num_short: int = 24, num_long: int = 6) -> list[tuple[dict, bool]]:
    """(question, is_long) in arrival order."""
    rng = random.Random(seed)
    shorts = [({"text": q, "max_tokens": SHORT_MAX_TOKENS}, False)
              for q in (HOT * 2)[: num_short // 2] + (VARIED * 2)[: num_short - num_short // 2]]
    longs = []
    for i in range(num_long):
        ticket = " ".join(s for _ in range(3) for s in rng.sample(TICKET, len(TICKET)))
        longs.append(({"text": f"Ticket #{1000 + i}. {ticket} Summarize this ticket and propose next steps.",
                       "max_tokens": LONG_MAX_TOKENS}, True))
    stream = shorts + longs
    rng.shuffle(stream)
    return stream


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(-(-len(ordered) * p // 100)) - 1)] if ordered else 0.0


def run_one(name: str, router: dict, model_and_tokenizer, stream: list[tuple[dict, bool]], pool: int = 16,
            parallel: int = 8) -> Row:
    import kev
    from kev.engine.engine_setup import build_parts

    strategy = router.get("strategy", name)
    config = kev.load_config({"core": {"max_context": 1024},
                              "router": {"strategy": strategy, "channel_pool_size": pool,
                                         "max_parallel_queries": parallel, "channel_queue_depth": 64,
                                         "breaker_threshold": None, "length_tiers": [128], **router}})
    with kev.Engine(config, build_parts(config, *model_and_tokenizer)) as engine:
        engine.generate(["warm up"], max_tokens=2, timeout=600)
        steps_before = engine.num_steps
        started = time.time()
        rid = engine.submit([q for q, _ in stream], timeout_ms=600_000, system=SYSTEM)
        results = list(zip(engine.wait(rid, 1200), (is_long for _, is_long in stream)))
        finished_at = [r.finished_at or started for r, _ in results]
        total = max(finished_at) - started
        step_ends = [s.at for s in list(engine.stats.recent)[-(engine.num_steps - steps_before):]]
    latency: dict[bool, list[float]] = {False: [], True: []}
    steps: dict[bool, list[int]] = {False: [], True: []}
    channels: dict[int, int] = {}
    tokens = {False: 0, True: 0}
    for r, is_long in results:
        assert r.status == "ok" and r.finished_at is not None and r.channel_id is not None, r.error
        latency[is_long].append((r.finished_at - started) * 1000)
        steps[is_long].append(bisect.bisect_left(step_ends, r.finished_at) + 1)  # the step that finished it
        channels[r.channel_id] = channels.get(r.channel_id, 0) + 1
        tokens[is_long] += r.tokens
    return Row(name, total, percentile(latency[False], 50), percentile(latency[False], 99),
               percentile(latency[True], 50), max(channels.values()) / len(results),
               tokens[True] / sum(tokens.values()), len(step_ends), percentile(steps[False], 50),
               percentile(steps[False], 99))


def median_row(rows: list[Row]) -> Row:
    med = lambda field: statistics.median(getattr(r, field) for r in rows)  # noqa: E731
    return Row(rows[0].name, med("total_s"), med("short_p50_ms"), med("short_p99_ms"), med("long_p50_ms"),
               med("busiest_share"), med("long_token_share"), med("total_steps"), med("short_p50_steps"),
               med("short_p99_steps"))


def format_table(rows: list[Row]) -> str:
    base = rows[0]
    lines = ["| strategy | total (s) | vs round_robin | short p50 (s) | short p99 (s) | long p50 (s) | total steps "
             "| short p50 / p99 (steps) | busiest channel |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.total_s:.1f} | {r.total_s / base.total_s:.2f}x | {r.short_p50_ms / 1000:.1f} | "
                     f"{r.short_p99_ms / 1000:.1f} | {r.long_p50_ms / 1000:.1f} | {r.total_steps} | "
                     f"{r.short_p50_steps:.0f} / {r.short_p99_steps:.0f} | {r.busiest_share:.0%} |")
    return "\n".join(lines)


def machine() -> str:
    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{platform.machine()}, {os.cpu_count()} CPU cores, {memory:.0f} GiB, {device}, torch {torch.__version__}, "
            f"fp32, Python {platform.python_version()}; load average at the end {load} (a shared machine)")


def run_routing(repeats: int = 1, seed: int = 0, pool: int = 16, parallel: int = 8,
                on_progress: Callable[[str, float, float], None] | None = None) -> tuple[str, list[Row]]:
    """(one-line description of the run, one median row per strategy); on_progress(label, runs done, runs in all)."""
    import kev
    from kev.engine.engine_setup import load_model_and_tokenizer

    model_and_tokenizer = load_model_and_tokenizer(kev.load_config({}))
    stream = traffic(seed)
    runs: dict[str, list[Row]] = {name: [] for name, _ in STRATEGIES}
    total = repeats * len(STRATEGIES)
    for repeat in range(repeats):
        # interleaved, so a slow spell of the machine hits every strategy
        for i, (name, router) in enumerate(STRATEGIES):
            if on_progress is not None:
                on_progress(f"{name} (run {repeat + 1}/{repeats})", repeat * len(STRATEGIES) + i, total)
            runs[name].append(run_one(name, router, model_and_tokenizer, stream, pool, parallel))
    rows = [median_row(rs) for rs in runs.values()]
    num_long = sum(is_long for _, is_long in stream)
    summary = (f"{len(stream)} questions, {num_long} long ({num_long / len(stream):.0%}) carrying "
               f"{rows[0].long_token_share:.0%} of the tokens (prompt + completion); short max_tokens "
               f"{SHORT_MAX_TOKENS}, long {LONG_MAX_TOKENS}; pool {pool} channels, max_parallel_queries {parallel}, "
               f"channel_queue_depth 64, length_tiers [128], breaker off unless named; seed {seed}, "
               f"median of {repeats} run(s)")
    return summary, rows


def write_markdown(path: Path, summary: str, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Routing under skewed traffic\n\n{summary}.\n\nMachine: {machine()}.\n\n"
                    f"{format_table(rows)}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per strategy; the table shows medians")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool", type=int, default=16, help="router.channel_pool_size")
    parser.add_argument("--parallel", type=int, default=8, help="router.max_parallel_queries")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    summary, rows = run_routing(args.repeats, args.seed, args.pool, args.parallel)
    print(summary, format_table(rows), f"Machine: {machine()}", sep="\n")
    if args.out:
        write_markdown(args.out, summary, rows)
    return 0
