"""Invariance and speed on random-weight 1B–8B Llama shapes (run by bench/gpu.sh on a CUDA machine).

For each shape: N questions of mixed lengths (random token ids) run alone and packed
(shuffled); counts answers whose tokens AND logits are bit-identical; then tokens/s of
Kev one-forward vs serial vs the non-invariant single-GEMM path. Prints one JSON line per shape.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import torch

import kev
from kev.bench.shapes import SHAPES
from kev.engine.engine_setup import build_parts, pick_device
from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer
from kev.model.weights import random_model


def engine_for(model, tokenizer, n: int, invariant: bool, record: bool) -> kev.Engine:
    config = kev.load_config({"router": {"max_parallel_queries": n, "channel_pool_size": n},
                              "core": {"max_context": 2048, "batch_invariant": invariant},
                              "aggregator": {"timeout_ms": 600_000}})
    return kev.Engine(config, build_parts(config, model, tokenizer), record_logits=record)


def check(shape: str, precision: str, n: int, max_tokens: int, tokenizer_folder: str | None) -> dict:
    device = pick_device("auto")
    cfg = SHAPES[shape]
    model = random_model(cfg, precision, device, max_positions=2048)
    tokenizer = Tokenizer.from_folder(tokenizer_folder or resolve_model_path("smollm2-135m-instruct"))
    rng = random.Random(0)
    questions = [{"prompt_ids": [rng.randrange(cfg.vocab_size) for _ in range(rng.choice([5, 40, 130, 600]))],
                  "max_tokens": max_tokens, "ignore_eos": True} for _ in range(n)]
    engine = engine_for(model, tokenizer, n, True, record=True)
    rows_plan = engine.runner.tiling.label
    engine.generate(questions[:2], timeout=600)
    solo, serial_s = [], 0.0
    for q in questions:
        started = time.perf_counter()
        solo.append(engine.generate([q], timeout=600)[0])
        serial_s += time.perf_counter() - started
    order = list(range(n))
    rng.shuffle(order)
    started = time.perf_counter()
    packed = engine.generate([questions[i] for i in order], timeout=600)
    kev_s = time.perf_counter() - started
    identical = sum(r.token_ids == solo[i].token_ids and torch.equal(r.logits, solo[i].logits)
                    for r, i in zip(packed, order))
    engine.close()
    fused = engine_for(model, tokenizer, n, False, record=False)
    fused.generate(questions[:2], timeout=600)
    started = time.perf_counter()
    fused_answers = fused.generate(questions, timeout=600)
    fused_s = time.perf_counter() - started
    fused_same = sum(a.token_ids == s.token_ids for a, s in zip(fused_answers, solo))
    fused.close()
    tokens = n * max_tokens
    return {"shape": shape, "precision": precision, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "n": n, "max_tokens": max_tokens, "rows": rows_plan, "identical_tokens_and_logits": f"{identical}/{n}",
            "kev_tok_s": round(tokens / kev_s, 1), "serial_tok_s": round(tokens / serial_s, 1),
            "non_invariant_tok_s": round(tokens / fused_s, 1), "non_invariant_same_tokens": f"{fused_same}/{n}",
            "kev_over_serial": round(serial_s / kev_s, 2), "invariance_cost": round(1 - fused_s / kev_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="llama-1b,llama-8b")
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tokenizer", help="a folder with tokenizer.json (default: the default model's, converted)")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        for precision in args.precisions.split(","):
            print(json.dumps(check(shape, precision, args.n, args.max_tokens, args.tokenizer)), flush=True)


if __name__ == "__main__":
    main()
