"""w8a8 against bf16 on two texts: the held-out text (bench/int8_quality.py's `perplexities`, bench/data) and a text
that neither the calibration (kev/model/calibration/smoothing.txt) nor GPTQ's damping choice (bench/gptq_damping.py,
README.md) used: docs/design.md's first 10,000 characters (English, ~2,900 tokens). For w8a8 round to nearest and
GPTQ at each damping given; a second text says whether a gain on the held-out text is more than its noise.

    KEV_CACHE_DIR=/tmp/kevcache-w8a8 .venv/bin/python bench/w8a8_other_text.py [--gptq 1,0.3,3]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import kev
import kev.model.smoothing as smoothing

sys.path.insert(0, str(Path(__file__).parent))
from int8_quality import perplexities  # noqa: E402

OTHER = Path(__file__).parent.parent / "docs" / "design.md"


def run(model: str, precision: str) -> dict:
    config = kev.load_config({"core": {"model_path": model, "precision": precision, "max_context": 4096},
                              "router": {"max_parallel_queries": 4, "channel_pool_size": 4}})
    start = time.perf_counter()
    with kev.Engine(config, background=False) as engine:
        loaded = time.perf_counter() - start
        heldout = perplexities(engine)["all"]["perplexity"]
        query = {"prompt": OTHER.read_text(encoding="utf-8")[:10000], "max_tokens": 0, "prompt_logprobs": True}
        result = engine.generate([query], timeout=3600)[0]
        assert result.status == "ok" and result.prompt_logprobs, result.error
        logprobs = [entry["logprob"] for entry in result.prompt_logprobs[1:]]
        return {"heldout": heldout, "other": round(math.exp(-sum(logprobs) / len(logprobs)), 4),
                "other_tokens": len(logprobs), "load_s": round(loaded, 1),
                "numerics": engine.runner.model.weight_numerics()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--gptq", default=f"{smoothing.DAMP:g}", help="GPTQ dampings, comma-separated")
    args = parser.parse_args()
    rows = {"bf16": run(args.model, "bf16")}
    smoothing.GPTQ = None
    rows["w8a8 round to nearest"] = run(args.model, "w8a8")
    for damp in args.gptq.split(","):
        smoothing.GPTQ = float(damp)
        rows[f"w8a8 gptq {damp}"] = run(args.model, "w8a8")
    base = rows["bf16"]
    for name, row in rows.items():
        print(json.dumps({name: row}))
        print(f"{name}: held-out {row['heldout']} ({row['heldout'] / base['heldout']:.4f}x bf16), docs/design.md "
              f"{row['other']} ({row['other'] / base['other']:.4f}x)", flush=True)


if __name__ == "__main__":
    main()
