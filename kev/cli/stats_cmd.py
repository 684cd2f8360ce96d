"""kev stats AUDIT.jsonl: traffic share per hash bucket and per channel, queue waits, hot spots."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from kev.results.audit_records import read_records
from kev.results.load_report import LoadReport, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("audit", help="audit log (JSON lines) written when audit.path is set")
    parser.add_argument("--hot-share", type=float, default=0.25, help="flag buckets above this share of traffic")
    parser.add_argument("--epsilon", type=float, default=0.25, help="flag channels above (1+ε)× the mean load")
    parser.add_argument("--channels", type=int, help="pool size (default: highest channel id seen + 1)")
    parser.add_argument("--top", type=int, default=10, help="buckets to list")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    report = summarize(read_records(args.audit, "result"), args.hot_share, args.epsilon, args.channels)
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        print_report(report, args.top)
    return 0


def print_report(report: LoadReport, top: int) -> None:
    console = Console(width=120)
    console.print(f"{report.num_results} results, strategy {', '.join(report.strategies) or '?'}, "
                  f"{report.num_channels} channels; busiest channel {report.max_load_vs_mean:.2f}× the mean")
    buckets = Table(title=f"hash buckets (hot: share > {report.hot_share:.0%})")
    for column in ("bucket", "questions", "share", "moved", "hot"):
        buckets.add_column(column, justify="right")
    for b in report.buckets[:top]:
        buckets.add_row(str(b.bucket), str(b.count), f"{b.share:.1%}", str(b.moved), "HOT" if b.is_hot else "")
    console.print(buckets)
    channels = Table(title=f"channels (over: > {1 + report.epsilon:.2f}× the mean)")
    for column in ("channel", "questions", "share", "× mean", "queue p50 ms", "queue p99 ms", "over"):
        channels.add_column(column, justify="right")
    for c in report.channels:
        channels.add_row(str(c.channel_id), str(c.count), f"{c.share:.1%}", f"{c.load_vs_mean:.2f}",
                         f"{c.queue_p50_ms:.0f}", f"{c.queue_p99_ms:.0f}", "OVER" if c.is_over else "")
    console.print(channels)
    for b in report.hot_buckets:
        console.print(f"hot spot: bucket {b.bucket} carries {b.share:.0%} of the questions "
                      "(try router.strategy consistent_hash, router.categories or router.breaker_threshold)")
