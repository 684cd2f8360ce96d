"""Kev's core.precision gguf against llama.cpp on the same GGUF file and prompt token ids: the next-token
log-probabilities of llama.cpp's top 10 at every prompt (llama-server's n_probs, before sampling), and the greedy
answers side by side. Writes bench/results/llamacpp_logits.json and .md (--out: another name).

    .venv/bin/python bench/llamacpp_logits.py [--model smollm2-135m-instruct] [--questions 8] [--max-tokens 32]
    .venv/bin/python bench/llamacpp_logits.py --kquant --out llamacpp_logits_kquant   # a K-quant GGUF (see --kquant)
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

import kev
from kev.bench.llamacpp_anchor import LlamaServer
from kev.bench.questions import BENCH_QUESTIONS
from kev.bench.throughput import prompt_ids
from kev.model.model_store import gguf_source

RESULTS = Path(__file__).parent / "results"
# max |Δ log-probability| over llama.cpp's top 10. Kev's residual stream and K/V are bf16 (llama.cpp's f32 and f16):
# Kev in fp32 on the same weights, dequantized, is measured beside gguf as the yardstick.
TOLERANCE = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default="llamacpp_logits", help="result file name under bench/results, no suffix")
    parser.add_argument("--kquant", action="store_true",
                        help="instead of --model: a small llama GGUF (hidden 768, 6 layers, FFN 2048) of random "
                             "Q4_K / Q5_K / Q6_K blocks as a Q4_K_M file mixes them, written under the cache")
    args = parser.parse_args()
    if args.kquant:
        args.model = str(_kquant_file())
    gguf = gguf_source(args.model)
    assert gguf is not None, "a .gguf model or alias"
    config = kev.load_config({"core": {"model_path": args.model, "precision": "gguf", "max_context": 1024},
                              "router": {"max_parallel_queries": 16, "channel_pool_size": 16}})
    questions = BENCH_QUESTIONS[: args.questions]
    rows = []
    fp32_config = kev.load_config(config, {"core": {"precision": "fp32"}})
    with kev.Engine(fp32_config, record_logits=True, background=False) as engine:
        fp32_first = engine.generate(questions, timeout=3600, max_tokens=1, temperature=0.0)
    with kev.Engine(config, record_logits=True, background=False) as engine:
        prompts = [prompt_ids(engine, q) for q in questions]
        kev_first = engine.generate(questions, timeout=3600, max_tokens=1, temperature=0.0)
        kev_answers = engine.generate(questions, timeout=3600, max_tokens=args.max_tokens, temperature=0.0,
                                      ignore_eos=True)
        with LlamaServer(gguf, 1, 1024, torch.get_num_threads()) as server:
            for q, ids, first, answer, exact in zip(questions, prompts, kev_first, kev_answers, fp32_first):
                probs = server.complete(ids, 1, n_probs=10)["completion_probabilities"][0]["top_logprobs"]
                diffs = _diffs(first.logits[0], probs)
                theirs = server.complete(ids, args.max_tokens)["tokens"]
                same = next((i for i, (a, b) in enumerate(zip(answer.token_ids, theirs)) if a != b), len(theirs))
                rows.append({"question": q, "max_abs_logprob_diff_top10": round(max(diffs), 4),
                             "fp32_max_abs_logprob_diff_top10": round(max(_diffs(exact.logits[0], probs)), 4),
                             "same_top1": first.token_ids[0] == probs[0]["id"],
                             "identical_tokens_before_divergence": same, "kev": answer.text,
                             "llamacpp": engine.tokenizer.decode(theirs)})
    report = {"model": args.model, "gguf": str(gguf), "tolerance": TOLERANCE, "max_tokens": args.max_tokens,
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "within_tolerance": sum(r["max_abs_logprob_diff_top10"] <= TOLERANCE for r in rows),
              "same_top1": sum(r["same_top1"] for r in rows), "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    lines = [f"# Kev gguf vs llama.cpp on {args.model} ({gguf.name})", "",
             f"Next-token log-probabilities of llama.cpp's top 10 at each prompt: within {TOLERANCE} for "
             f"{report['within_tolerance']}/{len(rows)} prompts, same top token {report['same_top1']}/{len(rows)}. "
             f"Greedy answers, {args.max_tokens} tokens (EOS ignored). Reproduce: "
             f"`.venv/bin/python bench/llamacpp_logits.py{' --kquant' if args.kquant else ''} --out {args.out}`.",
             f"Machine: {_machine()}.", "",
             "Kev fp32 (the same weights dequantized, fp32 activations) against llama.cpp, the yardstick: "
             f"max {max(r['fp32_max_abs_logprob_diff_top10'] for r in rows)}; Kev gguf: max "
             f"{max(r['max_abs_logprob_diff_top10'] for r in rows)}.", "",
             "| question | max |Δ logprob| gguf (fp32) | tokens equal before divergence | Kev gguf | llama.cpp |",
             "|---|---|---|---|---|"]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ⏎ ")  # noqa: E731
    for r in rows:
        lines.append(f"| {cell(r['question'])} | {r['max_abs_logprob_diff_top10']} "
                     f"({r['fp32_max_abs_logprob_diff_top10']}) | "
                     f"{r['identical_tokens_before_divergence']}/{args.max_tokens} | {cell(r['kev'])} | "
                     f"{cell(r['llamacpp'])} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))


def _kquant_file() -> Path:
    from gguf import GGMLQuantizationType as T

    from kev.bench.random_gguf import write_random_llama_gguf
    from kev.model.model_store import cache_root

    path = cache_root() / "bench" / "llama-small-random-kquant.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        types = {"token_embd": T.Q6_K, "attn_output": T.Q5_K, "ffn_gate": T.Q5_K, "ffn_up": T.Q5_K, "ffn_down": T.Q6_K}
        shape = {"hidden": 768, "layers": 6, "heads": 12, "kv_heads": 4, "ffn": 2048}
        write_random_llama_gguf(path, T.Q4_K, shape, seed=7, types=types)
    return path


def _machine() -> str:
    import os

    cpu = next(line for line in open("/proc/cpuinfo") if line.startswith("model name")).split(":")[1].strip()
    return f"{cpu}, load average {os.getloadavg()[0]:.1f}"


def _diffs(logits: torch.Tensor, top: list[dict]) -> list[float]:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [abs(float(logprobs[p["id"]]) - p["logprob"]) for p in top]


if __name__ == "__main__":
    main()
