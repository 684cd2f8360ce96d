"""kev bench --scenario extraction: questions whose answers copy spans of their own document (names, dates, amounts,
sentences), at N = 1, 4, 16, 64 questions in one batch, plain decoding and prompt-lookup drafts side by side in one
run: tok/s, engine steps, drafts accepted, and how many drafted answers are identical to the plain ones.

The documents are generated here from a fixed seed (invoices, delivery notes, meeting minutes), so the prompts are
the same on every machine. Plain answers come from the same engine with drafts turned off per request; each
`--draft-rows` value is an engine on the same weights whose speculative.max_step_rows is that value (the adaptive
policy's row budget), so one run measures where drafting stops paying as N grows.

`--against vllm`: vLLM's CPU build on the same prompt ids (Kev's chat template), plain and with its `ngram`
speculative method at the same draft length and match lengths, each in its own vLLM process; its drafted answers
are compared with its own plain ones (vLLM reports no step counts here: those columns are empty).
"""
from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kev.bench.throughput import model_folder, prompt_ids
from kev.bench.vllm_anchor import VllmBatch, run_vllm
from kev.config import load_config
from kev.engine.engine import Engine
from kev.engine.engine_setup import build_parts

SIZES = (1, 4, 16, 64)
MAX_TOKENS = 48
OFF = {"method": "off"}
Progress = Callable[[str, float, float], None]

FIRST = ["Jane", "Tomás", "Priya", "Wei", "Amara", "Lukas", "Sofia", "Kenji", "Fatima", "Oliver", "Ingrid", "Mateo"]
LAST = ["Okafor", "Lindqvist", "Raman", "Zhang", "Haddad", "Becker", "Rossi", "Tanaka", "Mensah", "Dubois"]
COMPANIES = ["Harbor Lane Supplies", "Northwind Logistics", "Blue Fern Studios", "Copperleaf Foods",
             "Granite Peak Tools", "Silverline Medical", "Oakridge Paper Mill", "Maple Street Bakery"]
STREETS = ["Keizersgracht", "Elm Road", "Rue de Lyon", "Station Street", "Hafenstraße", "Via Roma"]
CITIES = ["Amsterdam", "Leeds", "Lyon", "Utrecht", "Hamburg", "Turin"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
TASKS = ["Copy, word for word, the sentence that states the total amount due.",
         "Quote the contact person's full name and phone number exactly as written.",
         "Copy the delivery address exactly as written.",
         "Repeat the first sentence of the document word for word."]


@dataclass(frozen=True)
class ExtractionDoc:
    text: str

    def question(self, task: int) -> str:
        return f"{self.text}\n\n{TASKS[task % len(TASKS)]}"


def documents(count: int, seed: int = 41) -> list[ExtractionDoc]:
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        seller, buyer = rng.sample(COMPANIES, 2)
        person = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        date = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(2021, 2025)}"
        amount = f"{rng.randint(1, 99)},{rng.randint(100, 999)}.{rng.randint(10, 99)}"
        address = f"{rng.randint(1, 240)} {rng.choice(STREETS)}, {rng.randint(1000, 9999)} {rng.choice(CITIES)}"
        items = ", ".join(f"{rng.randint(2, 40)} boxes of {w}" for w in rng.sample(
            ["printer paper", "copper fittings", "rye flour", "surgical gloves", "oak boards", "coffee beans",
             "steel bolts", "lab notebooks"], 3))
        docs.append(ExtractionDoc(
            f"Invoice {1000 + 37 * i} was issued by {seller} to {buyer} on {date}. "
            f"The order covers {items}. "
            f"The total amount due is {amount} euros, payable within {rng.choice([14, 30, 45, 60])} days to account "
            f"NL{rng.randint(10, 99)}BANK0{rng.randint(100000000, 999999999)}. "
            f"Goods are delivered to {address}. "
            f"Contact person: {person}, phone +31 {rng.randint(10, 99)} {rng.randint(100, 999)} "
            f"{rng.randint(1000, 9999)}. "
            f"Late payments accrue interest of {rng.randint(2, 9)} percent per month, as agreed in the framework "
            f"contract signed on {rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(2015, 2020)}."))
    return docs


def questions(count: int) -> list[str]:
    docs = documents(-(-count // len(TASKS)))
    return [d.question(t) for d in docs for t in range(len(TASKS))][:count]


def _run(engine: Engine, batch: list[str], speculative: dict[str, Any] | None, max_tokens: int) -> dict[str, Any]:
    """One batch (N = 1: each question alone, one after another): seconds, steps, tokens, drafts, answers."""
    load, steps = engine.load(), engine.num_steps
    options: dict[str, Any] = {"max_tokens": max_tokens, "timeout": 3600, "timeout_ms": 600_000}
    if speculative is not None:
        options["speculative"] = speculative
    started = time.perf_counter()
    answers = engine.generate(batch, **options)
    seconds = time.perf_counter() - started
    bad = [a.error for a in answers if a.status != "ok"]
    if bad:
        raise RuntimeError(f"kev: {len(bad)} answers failed, first: {bad[0]}")
    after = engine.load()
    return {"seconds": seconds, "steps": engine.num_steps - steps,
            "tokens": sum(a.completion_tokens for a in answers),
            "drafted": after.spec_draft_tokens - load.spec_draft_tokens,
            "accepted": after.spec_accepted_tokens - load.spec_accepted_tokens,
            "answers": [a.token_ids for a in answers]}


def _batches(size: int, pool: list[str]) -> list[list[str]]:
    """N = 1 asks four questions, each alone; larger N ask N questions in one batch."""
    return [[q] for q in pool[:4]] if size == 1 else [pool[:size]]


def _measure(engine: Engine, size: int, pool: list[str], speculative: dict[str, Any] | None,
             max_tokens: int) -> dict[str, Any]:
    runs = [_run(engine, batch, speculative, max_tokens) for batch in _batches(size, pool)]
    total = {key: sum(r[key] for r in runs) for key in ("seconds", "steps", "tokens", "drafted", "accepted")}
    total["answers"] = [a for r in runs for a in r["answers"]]
    return total


def run_extraction(engine: Engine, sizes: list[int], draft_rows: list[int], progress: Progress,
                   against_vllm: bool = False, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """engine: background=False; its config's speculative section gives max_draft and the match lengths."""
    pool = questions(max(sizes + [4]))
    spec = engine.config.speculative
    on = {"method": "prompt_lookup", "max_draft": spec.max_draft, "min_match": spec.min_match,
          "max_match": spec.max_match}
    drafted = {rows: Engine(config, build_parts(config, engine.runner.model, engine.tokenizer), background=False)
               for rows in draft_rows
               for config in [load_config(engine.config, {"speculative": {"max_step_rows": rows}})]}
    engine.generate(["warm up"], max_tokens=2, timeout=600)
    rows: list[dict[str, Any]] = []
    done, total = 0, len(sizes) * (1 + len(drafted))
    try:
        for size in sizes:
            progress(f"N={size}: plain", done, total)
            plain = _measure(engine, size, pool, OFF, max_tokens)
            rows.append(_row(size, "plain", plain, plain))
            done += 1
            for budget, other in drafted.items():
                progress(f"N={size}: drafts, max_step_rows {budget}", done, total)
                rows.append(_row(size, f"drafts rows<={budget}", _measure(other, size, pool, on, max_tokens), plain))
                done += 1
    finally:
        for other in drafted.values():
            other.close()
    if against_vllm:
        progress("vLLM: plain and ngram drafts", done, total)
        rows += vllm_rows(engine, sizes, pool, on, max_tokens)
    return {"scenario": "extraction", "max_tokens": max_tokens, "max_draft": spec.max_draft,
            "match": [spec.min_match, spec.max_match], "rows": rows,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def vllm_rows(engine: Engine, sizes: list[int], pool: list[str], on: dict[str, Any],
              max_tokens: int) -> list[dict[str, Any]]:
    """vLLM's rows: the same batches on the same prompt ids, plain, then with its ngram drafts (vLLM's names for Kev's
    max_draft and match lengths). N = 1's four questions are four batches of one, timed together."""
    batches = [VllmBatch(f"n{size}_{i}", [prompt_ids(engine, q) for q in batch], max_tokens, False)
               for size in sizes for i, batch in enumerate(_batches(size, pool))]
    ngram = {"method": "ngram", "num_speculative_tokens": on["max_draft"], "prompt_lookup_min": on["min_match"],
             "prompt_lookup_max": on["max_match"]}
    core = engine.config.core
    runs = {}
    for path, speculative in (("plain", None), ("ngram", ngram)):
        out = run_vllm(model_folder(engine), core.resolved_precision, core.max_context, batches, solo=None,
                       speculative=speculative)
        runs[f"vllm {out['dtype']} {path}"] = {b["name"]: b for b in out["batches"]}
    rows = []
    for size in sizes:
        names = [b.name for b in batches if b.name.startswith(f"n{size}_")]
        measured = {path: {"seconds": sum(out[n]["seconds"] for n in names), "steps": None, "drafted": None,
                           "accepted": None, "answers": [ids for n in names for ids in out[n]["token_ids"]]}
                    for path, out in runs.items()}
        for run in measured.values():
            run["tokens"] = sum(len(ids) for ids in run["answers"])
        plain = next(iter(measured.values()))
        rows += [_row(size, path, run, plain) for path, run in measured.items()]
    return rows


def _row(size: int, path: str, run: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(run["answers"], plain["answers"]))
    return {"n": size, "path": path, "tokens": run["tokens"], "seconds": round(run["seconds"], 2),
            "tok_per_s": round(run["tokens"] / run["seconds"], 1), "steps": run["steps"],
            "drafted": run["drafted"], "accepted": run["accepted"],
            "acceptance": round(run["accepted"] / run["drafted"], 3) if run["drafted"] else None,
            "identical_to_plain": f"{same}/{len(plain['answers'])}",
            "speedup": round((run["tokens"] / run["seconds"]) / (plain["tokens"] / plain["seconds"]), 2)}


def format_extraction(report: dict[str, Any]) -> str:
    lines = [f"extraction: {report['max_tokens']} new tokens at most, greedy, max_draft {report['max_draft']}, match "
             f"{report['match'][0]}-{report['match'][1]} tokens; {report['model']} {report['precision']}; "
             f"{report['machine']}; load average {report['load_average']}", "",
             "| N | path | tokens | s | tok/s | vs plain | steps | drafted | accepted | acceptance "
             "| identical to plain |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["rows"]:
        acceptance = f"{r['acceptance']:.0%}" if r["acceptance"] is not None else "-"
        steps, drafted, accepted = (r[k] if r[k] is not None else "-" for k in ("steps", "drafted", "accepted"))
        lines.append(f"| {r['n']} | {r['path']} | {r['tokens']} | {r['seconds']:.2f} | {r['tok_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {steps} | {drafted} | {accepted} | {acceptance} | "
                     f"{r['identical_to_plain']} |")
    return "\n".join(lines)
