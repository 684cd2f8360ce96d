"""w8a8's SmoothQuant α by measurement: held-out perplexity (bench/int8_quality.py's `perplexities`, the texts under
bench/data) of bf16, of w8a8 without smoothing and of w8a8 with Kev's load-time smoothing (kev/model/smoothing.py,
calibrated on kev/model/calibration/smoothing.txt) at each α, on the default model. Each α is its own int8 cache
file (the cache key names the smoothing), so set KEV_CACHE_DIR to a scratch folder to leave the shared cache alone.

    KEV_CACHE_DIR=/tmp/kevcache-39 .venv/bin/python bench/smoothing_sweep.py [--alphas auto,0.5,qkv=0.5:down=0.75]
        [--bf16-activations] [--no-baselines] [--model M]

"auto" is Kev's default (α searched per layer and fold at load: smoothing.search_alphas); --bf16-activations measures
w8a8 with bf16 activations on a CPU without native bf16 (where Kev would take fp32).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from collections.abc import Callable

import torch

import kev
import kev.config.precision as precision
import kev.model.smoothing as smoothing
import kev.model.weights as weights
from kev.model.linear import Linear
from kev.model.llama import LlamaModel
from kev.model.quant_weight import pack_w8a8

sys.path.insert(0, str(Path(__file__).parent))
from int8_quality import perplexities  # noqa: E402


def perplexity(model: str, precision: str) -> dict:
    config = kev.load_config({"core": {"model_path": model, "precision": precision, "max_context": 4096},
                              "router": {"max_parallel_queries": 4, "channel_pool_size": 4}})
    start = time.perf_counter()
    with kev.Engine(config, background=False) as engine:
        loaded = time.perf_counter() - start
        return {"perplexity": perplexities(engine), "numerics": engine.runner.model.weight_numerics(),
                "load_s": round(loaded, 1)}


def w8a8_only(kinds: set[str]) -> Callable[[LlamaModel], None]:
    """to_w8a8 for the linears named (qkv_proj, o_proj, gate_up_proj, down_proj) only; the others stay int8
    weight-only: where int8 activations cost perplexity."""
    def convert(model: LlamaModel) -> None:
        for name, module in model.named_modules():
            if isinstance(module, Linear) and module.scale is not None and name.rsplit(".", 1)[-1] in kinds:
                module.packed = pack_w8a8(module.weight.data, module.scale, module.bias)
                module.weight = torch.nn.Parameter(module.weight.data.new_empty(0), requires_grad=False)
                module.scale = None
    return convert


def parse_alphas(entry: str) -> dict[str, float] | None:
    """"0.5": every fold at 0.5; "qkv=0.5:down=0.75": those folds only; "none": unsmoothed (and "auto": α searched
    per layer and fold over smoothing.GRID, set apart by the caller)."""
    if entry in ("none", "auto"):
        return None
    if "=" not in entry:
        return {fold: float(entry) for fold in smoothing.FOLDS}
    return {fold: float(alpha) for fold, alpha in (part.split("=") for part in entry.split(":"))}


def parse_clip(entry: str) -> tuple[float, ...]:
    """"none": (); "1-0.8-0.01": 1.0, 0.99 .. 0.8."""
    if entry == "none":
        return ()
    start, stop, step = (float(v) for v in entry.split("-"))
    return tuple(round(start - step * i, 4) for i in range(int(round((start - stop) / step)) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--no-baselines", action="store_true", help="skip bf16 and unsmoothed w8a8")
    parser.add_argument("--alphas", default="auto",
                        help="α for every fold in turn, or each entry fold=α:fold=α (none: unsmoothed; auto: searched "
                             "per layer and fold at load, Kev's default)")
    parser.add_argument("--bf16-activations", action="store_true",
                        help="w8a8 with bf16 activations as on a CPU with native bf16 (avx512_bf16 / AMX): the dtype "
                             "choice only (kev/config/precision.py), for a machine without it")
    parser.add_argument("--clip", default="default",
                        help="weight clip ratios searched per output row (smoothing.CLIP): default, none, or "
                             "start-stop-step, e.g. 1-0.8-0.01")
    parser.add_argument("--clip-rows", type=int, default=None,
                        help="the clip search's calibration rows at most (smoothing.CLIP_ROWS; 0: all)")
    parser.add_argument("--gptq", default="default",
                        help="the int8 weights rounded by GPTQ with this damping (smoothing.GPTQ, kev/model/gptq.py), "
                             "or off: to nearest")
    parser.add_argument("--w8a8-only", default="",
                        help="diagnostic: int8 activations only for these linears (qkv_proj,o_proj,gate_up_proj,"
                             "down_proj), the others int8 weight-only")
    args = parser.parse_args()
    if args.bf16_activations:
        precision.cpu_bf16_flags = lambda: ("avx512_bf16",)  # type: ignore[assignment]
        precision.pick_precision.cache_clear()
    if args.clip != "default":
        smoothing.CLIP = parse_clip(args.clip)
    if args.clip_rows is not None:
        smoothing.CLIP_ROWS = args.clip_rows
    if args.gptq != "default":
        smoothing.GPTQ = None if args.gptq == "off" else float(args.gptq)
    if args.w8a8_only:
        weights.to_w8a8 = w8a8_only(set(args.w8a8_only.split(",")))
    print(json.dumps({"uptime": os.getloadavg(), "cache": os.environ.get("KEV_CACHE_DIR"),
                      "activations": "bf16" if args.bf16_activations else "default",
                      "clip": smoothing.CLIP, "clip_rows": smoothing.CLIP_ROWS, "gptq": smoothing.GPTQ}), flush=True)
    rows = {}
    if not args.no_baselines:
        rows["bf16"] = perplexity(args.model, "bf16")
        print(json.dumps({"bf16": rows["bf16"]}), flush=True)
        clip, gptq, smoothing.CLIP, smoothing.GPTQ = smoothing.CLIP, smoothing.GPTQ, (), None
        smoothing.ALPHAS, smoothing.AUTO = None, None  # no smoothing, clipping nor GPTQ: load_model skips it
        rows["w8a8"] = perplexity(args.model, "w8a8")
        smoothing.CLIP, smoothing.GPTQ = clip, gptq
        print(json.dumps({"w8a8": rows["w8a8"]}), flush=True)
    for entry in args.alphas.split(","):
        smoothing.ALPHAS = parse_alphas(entry)
        smoothing.AUTO = smoothing.GRID if entry == "auto" else None
        rows[f"w8a8 α {entry}"] = perplexity(args.model, "w8a8")
        print(json.dumps({f"α {entry}": rows[f"w8a8 α {entry}"]}), flush=True)
    if "bf16" in rows:
        base = rows["bf16"]["perplexity"]["all"]["perplexity"]
        for name, row in rows.items():
            print(f"{name}: {row['perplexity']['all']['perplexity']} ({row['perplexity']['all']['perplexity'] / base:.4f}x"
                  f" bf16) en {row['perplexity']['en']['perplexity']} zh {row['perplexity']['zh']['perplexity']}")
    print(json.dumps({"uptime_after": os.getloadavg()}))


if __name__ == "__main__":
    main()
