"""kev bench: throughput ratios measured side by side in one run (absolute seconds mean little here)."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from kev.bench.mixed import LONG_PROMPTS, SHORT_PROMPTS, run_mixed
from kev.bench.random_gguf import TYPES as RANDOM_GGUF_TYPES
from kev.bench.throughput import load_hf_reference, run_throughput
from kev.cli.common import add_config_flags, config_from_args
from kev.cli.progress import progress_bar
from kev.config import KevConfig, load_config
from kev.engine.engine import Engine
from kev.engine.engine_setup import build_parts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--scenario", choices=["throughput", "mixed", "routing", "documents", "extraction"],
                        default="throughput",
                        help="mixed: 32 extraction prompts among 128 short questions, natural EOS "
                             "(kev/bench/mixed.py); routing: strategies under skewed traffic (kev/bench/routing.py); "
                             "documents: 32 ~2,900-token reports x 1 and x 3 tasks, prompt tokens/s against "
                             "document length (kev/bench/documents_scenario.py); extraction: answers that copy spans "
                             "of their document at N = 1, 4, 16, 64, plain and with prompt-lookup drafts "
                             "(kev/bench/extraction_scenario.py)")
    parser.add_argument("--draft-rows", default="16",
                        help="extraction: speculative.max_step_rows values to run drafts with, comma-separated")
    parser.add_argument("--documents", type=int, default=32, help="documents: how many reports")
    parser.add_argument("--solo-every", type=int, default=1,
                        help="documents: ask every k-th question alone for the identical-to-solo counts (1: all)")
    parser.add_argument("--against", choices=["vllm", "llamacpp"], action="append", default=[],
                        help="also run vLLM's CPU build (.venv-vllm, see `make bench-vllm`) or llama.cpp's "
                             "llama-server (a .gguf model; bench/build_llamacpp.sh) on the same prompts")
    parser.add_argument("--random-gguf", choices=RANDOM_GGUF_TYPES,
                        help="run on a Llama-1B-shaped GGUF of random weights in this quant type, written once under "
                             "the cache (kev/bench/random_gguf.py), instead of --model")
    parser.add_argument("--parallel", type=int,
                        help="router.max_parallel_queries (default: the largest size; mixed: all 160 questions at "
                             "once, as vLLM's CPU build takes up to 256)")
    parser.add_argument("--repeats", type=int, default=1, help="routing: runs per strategy (medians)")
    parser.add_argument("--sizes", default="1,4,8,16", help="numbers of questions, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="new tokens per question (throughput: EOS ignored; mixed: default 128 and extraction: "
                             "default 48, natural EOS)")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face batch path")
    parser.add_argument("--compare-precision", choices=["fp32", "bf16", "int8", "w8a8", "gguf"],
                        help="also run Kev at this core.precision (its own weights) at every N, side by side")
    parser.add_argument("--no-invariance-cost", action="store_true",
                        help="skip the non-invariant Kev run that prices batch invariance")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", type=Path, help="also write the JSON (routing: the markdown table) to this file")


# The anchors each scenario can run beside Kev (any other --against is an error, never ignored).
ANCHORS = {"throughput": {"vllm", "llamacpp"}, "mixed": {"vllm"}, "documents": {"vllm"}, "extraction": {"vllm"},
           "routing": set()}


def run(args: argparse.Namespace) -> int:
    unsupported = sorted(set(args.against) - ANCHORS[args.scenario])
    if unsupported:
        print(f"kev bench: --against {unsupported[0]} does not run with --scenario {args.scenario} "
              f"(it takes: {', '.join(sorted(ANCHORS[args.scenario])) or 'no anchor'})", file=sys.stderr)
        return 2
    if args.scenario == "routing":
        return run_routing_scenario(args)
    if args.scenario == "documents":
        return run_documents_scenario(args)
    if args.scenario == "extraction":
        return run_extraction_scenario(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    # mixed: every question at once, as vLLM's CPU build runs them (its max_num_seqs is 256 there); 64 channels
    # took ~20% longer on the Zen 4 (more, smaller decode steps).
    parallel = args.parallel or (LONG_PROMPTS + SHORT_PROMPTS if args.scenario == "mixed" else max(sizes))
    # round_robin: every question gets a channel of its own, so the run measures the one-forward engine,
    # not a routing strategy (`kev bench --scenario routing` compares those).
    config = config_from_args(args, {"router": {"max_parallel_queries": parallel, "channel_pool_size": parallel,
                                                "strategy": "round_robin"},
                                     "core": {"max_context": 1024}})
    # The caller drives the steps (no loop thread), in the thread that runs the serial and HF paths too:
    # a second OpenMP pool makes every GEMM slower on a small CPU (docs/design.md, Known limits).
    if args.random_gguf:
        from kev.bench.random_gguf import random_llama_gguf

        config = load_config(config, {"core": {"model_path": str(random_llama_gguf(args.random_gguf))}})
    if args.scenario == "mixed":
        return run_mixed_scenario(args, config)
    with progress_bar("loading the model") as bar, Engine(config, background=False) as engine:
        if not args.no_hf:
            bar("loading the Hugging Face reference", 0, 1)
        hf = None if args.no_hf else load_hf_reference(engine)
        fused = None
        if not args.no_invariance_cost:
            fused_config = load_config(config, {"core": {"batch_invariant": False}})
            fused = Engine(fused_config, build_parts(fused_config, engine.runner.model, engine.tokenizer),
                           background=False)
        other = None
        if args.compare_precision:
            bar(f"loading the model at {args.compare_precision}", 0, 1)
            other = Engine(load_config(config, {"core": {"precision": args.compare_precision}}), background=False)
        report = run_throughput(engine, sizes, args.max_tokens, hf, fused, "vllm" in args.against, bar, other,
                                "llamacpp" in args.against)
        for extra in (fused, other):
            if extra is not None:
                extra.close()
    report = {**run_facts(config), "max_tokens": args.max_tokens, **report}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


def run_facts(config: KevConfig) -> dict[str, Any]:
    from kev.model.row_invariance import cpu_model

    return {"model": config.core.model_path, "precision": config.core.resolved_precision,
            "precision_choice": config.core.precision_choice,
            "threads": torch.get_num_threads(),
            "machine": f"{cpu_model()}, {platform.machine()}, {torch.get_num_threads()} threads, "
                       f"torch {torch.__version__}"}


def run_mixed_scenario(args: argparse.Namespace, config: KevConfig) -> int:
    max_tokens = 128 if args.max_tokens == 64 else args.max_tokens  # the scenario's default: up to 128 new tokens
    with Engine(config, background=False) as engine:
        fingerprint = engine.runner.fingerprint
        report = {**run_facts(config), "max_tokens": max_tokens, "numerics_fingerprint": fingerprint,
                  "max_parallel": config.router.max_parallel_queries,
                  **run_mixed(engine, max_tokens, "vllm" in args.against)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return 0
    table = Table(title=f"mixed batch: {report['long_prompts']} long + {report['short_prompts']} short, "
                        f"{report['model']} {report['precision']}, {report['machine']}")
    for column in ("path", "questions", "tokens", "seconds", "tok/s", "identical to solo", "kev time / path"):
        table.add_column(column, justify="right")
    for r in report["rows"]:
        table.add_row(r["path"], str(r["questions"]), str(r["completion_tokens"]), f"{r['seconds']:.2f}",
                      f"{r['tok_per_s']:.1f}", r["identical_to_solo"], f"{r['kev_time_over_path']:.2f}x")
    Console().print(table)
    return 0


def run_documents_scenario(args: argparse.Namespace) -> int:
    from kev.bench.documents_scenario import format_documents, run_documents

    parallel = args.parallel or 32
    # Room for 4,000-token documents, and KV for every running question plus the documents' shared starts.
    config = config_from_args(args, {"router": {"max_parallel_queries": parallel, "channel_pool_size": parallel},
                                     "core": {"max_context": 4608, "kv_cache_tokens": 200_000}})
    with progress_bar("loading the model") as bar, Engine(config, background=False) as engine:
        report = {**run_facts(config), "numerics_fingerprint": engine.runner.fingerprint, "max_parallel": parallel,
                  **run_documents(engine, "vllm" in args.against, bar, args.documents, args.solo_every)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report) if args.json else format_documents(report))
    return 0


def run_extraction_scenario(args: argparse.Namespace) -> int:
    from kev.bench.extraction_scenario import MAX_TOKENS, SIZES, format_extraction, run_extraction

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes != "1,4,8,16" else list(SIZES)
    parallel = args.parallel or max(sizes)
    config = config_from_args(args, {"router": {"max_parallel_queries": parallel, "channel_pool_size": parallel,
                                                "strategy": "round_robin"},
                                     "core": {"max_context": 1024, "kv_cache_tokens": 24_576}})
    if config.speculative.method == "off":  # the config's match lengths and max_draft, drafting on
        config = load_config(config, {"speculative": {"method": "prompt_lookup"}})
    draft_rows = [int(r) for r in args.draft_rows.split(",")]
    with progress_bar("loading the model") as bar, Engine(config, background=False) as engine:
        report = {**run_facts(config), "numerics_fingerprint": engine.runner.fingerprint,
                  **run_extraction(engine, sizes, draft_rows, bar, against_vllm="vllm" in args.against,
                                   max_tokens=MAX_TOKENS if args.max_tokens == 64 else args.max_tokens)}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report) if args.json else format_extraction(report))
    return 0


def run_routing_scenario(args: argparse.Namespace) -> int:
    from kev.bench.routing import format_table, machine, run_routing, write_markdown

    with progress_bar("loading the model") as bar:
        summary, rows = run_routing(args.repeats, on_progress=bar)
    if args.out:
        write_markdown(args.out, summary, rows)
    print(summary, format_table(rows), f"Machine: {machine()}", sep="\n")
    return 0


def print_report(report: dict) -> None:
    table = Table(title=f"{report['model']} {report['precision']}, {report['machine']}, "
                        f"{report['max_tokens']} new tokens each")
    for column in ("N", "path", "tokens", "seconds", "tok/s", "identical to solo", "kev / path"):
        table.add_column(column, justify="right")
    for r in report["results"]:
        kev_rate = next(x["tok_per_s"] for x in report["results"] if x["n"] == r["n"] and x["path"] == "kev")
        table.add_row(str(r["n"]), r["path"], str(r["tokens"]), f"{r['seconds']:.2f}", f"{r['tok_per_s']:.1f}",
                      r["identical_to_solo"], f"{kev_rate / r['tok_per_s']:.2f}x")
    Console().print(table)
    steps = Table(title="decode step vs the linear layers alone at N rows (the bound)")
    for column in ("N", "step ms", "linear bound ms", "bound / step"):
        steps.add_column(column, justify="right")
    for n, s in report.get("decode_steps", {}).items():
        steps.add_row(n, f"{s['step_ms']:.1f}", f"{s['linear_bound_ms']:.1f}", f"{s['bound_share']:.0%}")
    Console().print(steps)
