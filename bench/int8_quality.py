"""core.precision int8, w8a8 and gguf against bf16 on the same weights: perplexity on held-out text (English and
Chinese, bench/data/heldout_*.txt, written for this check, ~3,400 tokens) and the greedy answers to the bench
questions, side by side. Writes bench/results/precision_quality.json and .md (int8_quality.* are the earlier
int8-only run).

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


PRECISIONS = ("bf16", "int8", "w8a8", "gguf")


def run_precision(precision: str, max_tokens: int) -> tuple[dict, list[str]]:
    config = kev.load_config({"core": {"precision": precision, "max_context": 4096},
                              "router": {"max_parallel_queries": 16, "channel_pool_size": 16}})
    with kev.Engine(config, background=False) as engine:
        report = {"perplexity": perplexities(engine), "weight_bytes": engine.runner.model.weight_bytes(),
                  "numerics": engine.runner.model.weight_numerics()}
        results = engine.generate(BENCH_QUESTIONS, timeout=3600, max_tokens=max_tokens, temperature=0.0)
    return report, [r.text for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    report: dict = {"questions": BENCH_QUESTIONS, "max_tokens": args.max_tokens}
    answers = {}
    for precision in PRECISIONS:
        report[precision], answers[precision] = run_precision(precision, args.max_tokens)
    base = report["bf16"]
    for precision in PRECISIONS[1:]:
        got = report[precision]
        report[f"{precision}_over_bf16"] = {
            "perplexity": {lang: round(got["perplexity"][lang]["perplexity"] / base["perplexity"][lang]["perplexity"], 4)
                           for lang in ("en", "zh", "all")},
            "weight_bytes": round(got["weight_bytes"] / base["weight_bytes"], 3),
            "same_greedy_answer": sum(a == b for a, b in zip(answers["bf16"], answers[precision]))}
    report["answers"] = answers
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "precision_quality.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (RESULTS / "precision_quality.md").write_text(markdown(report, answers, args.max_tokens))
    print(json.dumps({p: report[f"{p}_over_bf16"] for p in PRECISIONS[1:]}, indent=1))


def markdown(report: dict, answers: dict[str, list[str]], max_tokens: int) -> str:
    lines = ["# Precisions vs bf16, default model (SmolLM2-135M-Instruct, its Q4_1 GGUF)", "",
             "bf16, int8 and w8a8 run the GGUF's weights dequantized (to bf16, then int8 per output channel); gguf runs "
             "the file's own Q4_1 / Q8_0 blocks. Reproduce: `.venv/bin/python bench/int8_quality.py` "
             "(numbers in precision_quality.json).", "",
             "| precision | weights held (MB) | perplexity en | zh | all | all / bf16 | greedy = bf16 |",
             "|---|---|---|---|---|---|---|"]
    for p in PRECISIONS:
        ppl, ratio = report[p]["perplexity"], report.get(f"{p}_over_bf16")
        lines.append(f"| {p} | {report[p]['weight_bytes'] / 1e6:.1f} | {ppl['en']['perplexity']} | "
                     f"{ppl['zh']['perplexity']} | {ppl['all']['perplexity']} | "
                     f"{ratio['perplexity']['all'] if ratio else 1.0} | "
                     f"{ratio['same_greedy_answer'] if ratio else len(BENCH_QUESTIONS)}/{len(BENCH_QUESTIONS)} |")
    lines += ["", f"Greedy answers (max {max_tokens} tokens):", "",
              "| question | " + " | ".join(PRECISIONS) + " |", "|---" * (len(PRECISIONS) + 1) + "|"]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ⏎ ")  # noqa: E731
    for i, q in enumerate(BENCH_QUESTIONS):
        lines.append(f"| {cell(q)} | " + " | ".join(cell(answers[p][i]) for p in PRECISIONS) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
