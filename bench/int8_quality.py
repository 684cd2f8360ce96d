"""core.precision int8 against bf16 on the same weights: perplexity on held-out text (English and Chinese,
bench/data/heldout_*.txt, written for this check, ~3,400 tokens) and the greedy answers to the bench
questions, side by side. Writes bench/results/int8_quality.json and .md.

    .venv/bin/python bench/int8_quality.py [--max-tokens 48]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import kev
from kev.bench.questions import BENCH_QUESTIONS

HERE = Path(__file__).parent
TEXTS = {"en": HERE / "data" / "heldout_en.txt", "zh": HERE / "data" / "heldout_zh.txt"}
RESULTS = HERE / "results"


def perplexities(engine: kev.Engine) -> dict[str, dict[str, float]]:
    """exp(mean negative log-likelihood) of every token after the first, each text one question (one forward)."""
    queries = [{"prompt": path.read_text(), "max_tokens": 0, "prompt_logprobs": True} for path in TEXTS.values()]
    out = {}
    for lang, result in zip(TEXTS, engine.generate(queries, timeout=3600)):
        assert result.status == "ok" and result.prompt_logprobs, result.error
        logprobs = [entry["logprob"] for entry in result.prompt_logprobs[1:]]
        out[lang] = {"tokens": len(logprobs), "perplexity": round(math.exp(-sum(logprobs) / len(logprobs)), 4)}
    scored = sum(v["tokens"] for v in out.values())
    total_nll = sum(v["tokens"] * math.log(v["perplexity"]) for v in out.values())
    out["all"] = {"tokens": scored, "perplexity": round(math.exp(total_nll / scored), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    report: dict = {"questions": BENCH_QUESTIONS, "max_tokens": args.max_tokens}
    answers = {}
    for precision in ("bf16", "int8"):
        config = kev.load_config({"core": {"precision": precision, "max_context": 4096},
                                  "router": {"max_parallel_queries": 16, "channel_pool_size": 16}})
        with kev.Engine(config, background=False) as engine:
            report[precision] = {"perplexity": perplexities(engine),
                                 "weight_bytes": engine.runner.model.weight_bytes()}
            results = engine.generate(BENCH_QUESTIONS, timeout=3600, max_tokens=args.max_tokens, temperature=0.0)
            answers[precision] = [r.text for r in results]
    ppl = {lang: round(report["int8"]["perplexity"][lang]["perplexity"] / report["bf16"]["perplexity"][lang]["perplexity"], 4)
           for lang in ("en", "zh", "all")}
    report["int8_over_bf16"] = {"perplexity": ppl,
                                "weight_bytes": round(report["int8"]["weight_bytes"] / report["bf16"]["weight_bytes"], 3),
                                "same_greedy_answer": sum(a == b for a, b in zip(answers["bf16"], answers["int8"]))}
    report["answers"] = answers
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "int8_quality.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    lines = ["# int8 (weight-only) vs bf16, default model", "",
             "Reproduce: `.venv/bin/python bench/int8_quality.py` (numbers in int8_quality.json).", "",
             "| text | tokens | bf16 perplexity | int8 perplexity | int8 / bf16 |", "|---|---|---|---|---|"]
    for lang in ("en", "zh", "all"):
        b, i = report["bf16"]["perplexity"][lang], report["int8"]["perplexity"][lang]
        lines.append(f"| {lang} | {b['tokens']} | {b['perplexity']} | {i['perplexity']} | {ppl[lang]} |")
    lines += ["", f"Weights held: int8 / bf16 = {report['int8_over_bf16']['weight_bytes']}. "
              f"Greedy answers identical: {report['int8_over_bf16']['same_greedy_answer']}/{len(BENCH_QUESTIONS)} "
              f"(max {args.max_tokens} tokens).", "", "| question | bf16 | int8 |", "|---|---|---|"]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ⏎ ")  # noqa: E731
    for q, b, i in zip(BENCH_QUESTIONS, answers["bf16"], answers["int8"]):
        lines.append(f"| {cell(q)} | {cell(b)} | {cell(i)} |")
    (RESULTS / "int8_quality.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: report[k] for k in ("int8_over_bf16",)} | {p: report[p]["perplexity"] for p in ("bf16", "int8")}, indent=1))


if __name__ == "__main__":
    main()
