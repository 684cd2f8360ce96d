"""kev bench --scenario documents: batch extraction over long documents (the article's §5.1), Kev against vLLM's CPU
build on the same prompt ids, in one run.

- one task: 32 business reports of ~2,900 tokens (English and Chinese, kev/bench/documents.py), one extraction
  task each, 16 new tokens, greedy: wall time, and how many answers equal the same question asked alone;
- three tasks: the same documents x 3 tasks in one call (Kev computes each document once: engine/shared_starts.py;
  vLLM reuses cached prefix blocks; its cache is emptied between batches so no run inherits another's);
- prompt tokens/s against document length (4 documents, 1 new token), beside the linear layers' bound (every
  layer's qkv, o, gate_up and down at one full step of rows, nothing else);
- time to first token of short questions queued behind 8 long documents (Kev).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kev.bench.documents import Document, document_set
from kev.bench.linear_bound import linear_stack_ms
from kev.bench.throughput import model_folder, prompt_ids
from kev.bench.vllm_anchor import VllmBatch, run_vllm
from kev.engine.engine import Engine

NUM_DOCUMENTS, DOCUMENT_TOKENS, MAX_TOKENS = 32, 2900, 16
LENGTHS = [500, 1000, 2000, 3000, 4000]
SWEEP_DOCUMENTS = 4
SHORT_QUESTIONS = ["What is 17 times 23?", "北京是哪个国家的首都？", "Name a primary colour.", "一年有几个季节？"]
Progress = Callable[[str, float, float], None]


def _count(engine: Engine) -> Callable[[str], int]:
    return lambda text: len(engine.tokenizer.encode(text))


def _timed(engine: Engine, questions: list[str], max_tokens: int) -> tuple[float, list[list[int]]]:
    started = time.perf_counter()
    answers = engine.generate(questions, timeout=3600, max_tokens=max_tokens, timeout_ms=600_000)
    seconds = time.perf_counter() - started
    bad = [a.error for a in answers if a.status != "ok"]
    if bad:
        raise RuntimeError(f"kev: {len(bad)} answers failed, first: {bad[0]}")
    return seconds, [a.token_ids for a in answers]


def _same(a: list[list[int]], b: list[list[int]]) -> str:
    return f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"


def _row(one_s: float, three_s: float, one: list[list[int]], three: list[list[int]], solo: list[list[int]],
         checked: list[int]) -> dict[str, Any]:
    """checked[i]: the index (into the three-task list) of the question solo[i] answered alone."""
    one_checked = [(one[i // 3], s) for i, s in zip(checked, solo) if i % 3 == 0]
    return {"one_task_s": round(one_s, 2), "three_tasks_s": round(three_s, 2),
            "one_task_identical_to_solo": _same([a for a, _ in one_checked], [s for _, s in one_checked]),
            "three_tasks_identical_to_solo": _same([three[i] for i in checked], solo)}


def _sweep_questions(engine: Engine) -> dict[int, list[str]]:
    return {length: [d.question(0) for d in document_set(SWEEP_DOCUMENTS, length, _count(engine))]
            for length in LENGTHS}


def _ttft_behind_documents(engine: Engine, docs: list[Document]) -> dict[str, Any]:
    """8 documents, then 4 short questions in a second request submitted right behind them."""
    long_id = engine.submit([d.question(0) for d in docs[:8]], max_tokens=MAX_TOKENS, timeout_ms=600_000)
    short_id = engine.submit(SHORT_QUESTIONS, max_tokens=MAX_TOKENS, timeout_ms=600_000)
    short = engine.wait(short_id, 3600)
    long = engine.wait(long_id, 3600)
    ttft = sorted(r.ttft_ms or 0.0 for r in short)
    return {"short_ttft_ms": [round(t) for t in ttft], "documents_ttft_ms_median": round(
        sorted(r.ttft_ms or 0.0 for r in long)[len(long) // 2])}


def run_documents(engine: Engine, against_vllm: bool, progress: Progress, num_documents: int = NUM_DOCUMENTS,
                  solo_every: int = 1) -> dict[str, Any]:
    """solo_every: ask every k-th question alone for the identical-to-solo counts (1: all; both engines)."""
    docs = document_set(num_documents, DOCUMENT_TOKENS, _count(engine))
    one = [d.question(0) for d in docs]
    three = [d.question(t) for d in docs for t in range(3)]
    sweep = _sweep_questions(engine)
    engine.generate(["warm up"], timeout=600, max_tokens=2)
    progress(f"kev: {len(docs)} documents x 1 task", 0, 5)
    kev_one_s, kev_one = _timed(engine, one, MAX_TOKENS)
    progress(f"kev: {len(docs)} documents x 3 tasks", 1, 5)
    kev_three_s, kev_three = _timed(engine, three, MAX_TOKENS)
    progress("kev: prompt tokens/s against document length", 2, 5)
    kev_sweep = {length: _timed(engine, qs, 1)[0] for length, qs in sweep.items()}
    progress("kev: each question alone", 3, 5)
    checked = list(range(0, len(three), solo_every))
    solo = [_timed(engine, [three[i]], MAX_TOKENS)[1][0] for i in checked]
    ttft = _ttft_behind_documents(engine, docs)
    rows = {"kev": _row(kev_one_s, kev_three_s, kev_one, kev_three, solo, checked)}
    sweep_tokens = {length: sum(len(prompt_ids(engine, q)) for q in qs) for length, qs in sweep.items()}
    sweep_rows: list[dict[str, Any]] = [{"document_tokens": length, "prompt_tokens": sweep_tokens[length],
                                         "kev_tok_per_s": round(sweep_tokens[length] / s)}
                                        for length, s in kev_sweep.items()]
    if against_vllm:
        progress("vLLM: the same batches, then each question alone", 4, 5)
        batches = [VllmBatch("one_task", [prompt_ids(engine, q) for q in one], MAX_TOKENS, False),
                   VllmBatch("three_tasks", [prompt_ids(engine, q) for q in three], MAX_TOKENS, False),
                   VllmBatch("solo", [prompt_ids(engine, three[i]) for i in checked], MAX_TOKENS, False, True)]
        batches += [VllmBatch(f"length_{length}", [prompt_ids(engine, q) for q in qs], 1, False)
                    for length, qs in sweep.items()]
        out = run_vllm(model_folder(engine), engine.config.core.resolved_precision, engine.config.core.max_context,
                       batches, solo="solo")
        got = {b["name"]: b for b in out["batches"]}
        rows["vllm"] = _row(got["one_task"]["seconds"], got["three_tasks"]["seconds"], got["one_task"]["token_ids"],
                            got["three_tasks"]["token_ids"], out["solo"], checked)
        for row in sweep_rows:
            row["vllm_tok_per_s"] = round(row["prompt_tokens"] / got[f"length_{row['document_tokens']}"]["seconds"])
    step_rows = engine.config.core.max_step_tokens
    bound = step_rows * 1000 / linear_stack_ms(engine.runner.model, step_rows, with_lm_head=False)
    for row in sweep_rows:
        row["linear_bound_tok_per_s"] = round(bound)
    return {"scenario": "documents", "documents": num_documents, "max_tokens": MAX_TOKENS, "solo_every": solo_every,
            "document_prompt_tokens": [min(len(prompt_ids(engine, q)) for q in one),
                                       max(len(prompt_ids(engine, q)) for q in one)],
            "rows": rows, "length_sweep": sweep_rows, "ttft_behind_8_documents": ttft,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def format_documents(report: dict[str, Any]) -> str:
    """The report as markdown tables (README, bench/results)."""
    rows, lines = report["rows"], []
    lines += [f"{report['documents']} documents of {report['document_prompt_tokens'][0]}-"
              f"{report['document_prompt_tokens'][1]} prompt tokens, {report['max_tokens']} new tokens, greedy; "
              f"{report['model']} {report['precision']}; {report['machine']}; load average {report['load_average']}",
              "", "| engine | 1 task (s) | 3 tasks (s) | identical to solo (1 task / 3 tasks) |", "|---|---:|---:|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['one_task_s']:.1f} | {r['three_tasks_s']:.1f} | "
                     f"{r['one_task_identical_to_solo']} / {r['three_tasks_identical_to_solo']} |")
    if "vllm" in rows:
        kev, vllm = rows["kev"], rows["vllm"]
        lines.append(f"\nKev / vLLM time: 1 task {kev['one_task_s'] / vllm['one_task_s']:.2f}x, 3 tasks "
                     f"{kev['three_tasks_s'] / vllm['three_tasks_s']:.2f}x; Kev 3 tasks / 1 task "
                     f"{kev['three_tasks_s'] / kev['one_task_s']:.2f}x")
    lines += ["", "| document tokens | Kev prompt tok/s | vLLM prompt tok/s | linear layers' bound tok/s |",
              "|---:|---:|---:|---:|"]
    for r in report["length_sweep"]:
        lines.append(f"| {r['document_tokens']} | {r['kev_tok_per_s']} | {r.get('vllm_tok_per_s', '-')} | "
                     f"{r['linear_bound_tok_per_s']} |")
    ttft = report["ttft_behind_8_documents"]
    lines.append(f"\nShort questions submitted right behind 8 documents: time to first token "
                 f"{ttft['short_ttft_ms']} ms (the documents' median: {ttft['documents_ttft_ms_median']} ms)")
    return "\n".join(lines)
