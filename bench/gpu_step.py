"""Kev's CUDA step on random-weight Llama shapes: tokens/s, decode step vs the weight-streaming floor, what invariance
costs on the same graphs, transformers' padded `generate` on the same weights, and answers identical to solo.

One JSON line per (shape, path, N) on stdout; bench/gpu.sh runs it within its time budget (--deadline-s: parts that
would start past it are skipped and said so, so a run always leaves what it measured). --dry-run: a tiny shape on
this machine's device (CPU: a check that the script runs, not a benchmark).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

import torch

import kev
from kev.bench.shapes import SHAPES
from kev.engine.engine_setup import build_parts, pick_device
from kev.model.triton import triton_importable
from kev.model.families import model_class
from kev.model.llama import LlamaModel
from kev.model.model_config import ModelConfig
from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer

STREAM_BYTES_PER_S = 4.3e12  # the H200's measured device copy rate (shared/notes/gpu-path-facts.md)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Clock:
    def __init__(self, deadline_s: float) -> None:
        self.start, self.deadline_s = time.perf_counter(), deadline_s

    def left(self) -> float:
        return self.deadline_s - (time.perf_counter() - self.start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def random_weights(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_positions: int) -> LlamaModel:
    """Random weights made on the device itself (an 8B model in seconds; weights.random_model builds on the CPU)."""
    with torch.device("meta"):
        model = model_class(cfg)(cfg, max_positions)
    model = model.to(dtype=dtype).to_empty(device=device).eval()
    generator = torch.Generator(device=device).manual_seed(0)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02, generator=generator)
    model.rope = model.make_rope().to(device, dtype)
    return model


def questions(n: int, vocab: int, max_tokens: int, lengths: list[int]) -> list[dict[str, Any]]:
    rng = random.Random(0)
    return [{"prompt_ids": [rng.randrange(vocab) for _ in range(rng.choice(lengths))], "max_tokens": max_tokens,
             "ignore_eos": True} for _ in range(n)]


def engine_for(model: LlamaModel, tokenizer: Tokenizer, max_rows: int, max_context: int, invariant: bool,
               linear: str, kernels: str, tile: int) -> kev.Engine:
    config = kev.load_config({"router": {"max_parallel_queries": max_rows, "channel_pool_size": max_rows,
                                         "strategy": "round_robin", "default_timeout_ms": 600_000},
                              "core": {"max_context": max_context, "batch_invariant": invariant,
                                       "gpu_linear": linear, "kernels": kernels, "max_step_tokens": 1024,
                                       "linear_tile": tile}})
    started = time.perf_counter()
    engine = kev.Engine(config, build_parts(config, model, tokenizer))
    if engine.runner.graphs is None and model.device.type == "cpu" and kernels == "triton":
        engine.runner.use_decode_graphs(max_rows, max_context)  # the dry run: the buckets, eagerly
    graphs = engine.runner.graphs
    print(json.dumps({"event": "engine", "invariant": invariant, "linear": linear, "linear_tile": tile,
                      "rows": engine.runner.tiling.label, "start_s": round(
        time.perf_counter() - started, 1), "graph_capture_s": round(graphs.capture_seconds, 1) if graphs else None,
        "buckets": [b.rows for b in graphs.buckets] if graphs else None,
        "fingerprint": engine.runner.fingerprint}), flush=True)
    return engine


def answers(results: list[Any], logprobs: bool) -> list[tuple]:
    """What must be identical to solo: the tokens, and (where asked) every token's logprob."""
    return [(tuple(r.token_ids), tuple(e["logprob"] for e in r.logprobs or []) if logprobs else ()) for r in results]


def step_ms(engine: kev.Engine, rows: int, repeats: int) -> float | None:
    """One decode step of `rows` rows: a replay of its CUDA graph (padding rows only: no key is read or written),
    or the eager bucket where there is no graph."""
    graphs = engine.runner.graphs
    if graphs is None:
        return None
    bucket = next(b for b in graphs.buckets if b.rows >= rows)
    device = engine.runner.device
    with torch.inference_mode():
        run = bucket.graph.replay if bucket.graph is not None else (lambda: graphs.step(bucket))
        run()
        sync(device)
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        sync(device)
    return (time.perf_counter() - started) / repeats * 1000


def kev_path(name: str, engine: kev.Engine, qs: list[dict[str, Any]], sizes: list[int], solo: list[tuple],
             floor_ms: float, shape: str, clock: Clock, repeats: int) -> None:
    rng = random.Random(1)
    for n in sizes:
        if clock.left() < 20:
            print(json.dumps({"shape": shape, "path": name, "n": n, "skipped": "out of time"}), flush=True)
            continue
        order = list(range(n))
        rng.shuffle(order)
        sync(engine.runner.device)
        started = time.perf_counter()
        results = engine.generate([qs[i] for i in order], timeout=600)
        sync(engine.runner.device)
        seconds = time.perf_counter() - started
        got = answers(results, False)
        same = sum(got[k][0] == solo[i][0] for k, i in enumerate(order))
        decode = step_ms(engine, n, repeats)
        tokens = sum(len(r.token_ids) for r in results)
        print(json.dumps({"shape": shape, "path": name, "n": n, "tok_s": round(tokens / seconds, 1),
                          "seconds": round(seconds, 2), "decode_step_ms": round(decode, 3) if decode else None,
                          "floor_ms": round(floor_ms, 3),
                          "floor_fraction": round(floor_ms / decode, 3) if decode else None,
                          "decode_tok_s": round(n / decode * 1000, 1) if decode else None,
                          "identical_to_solo_tokens": f"{same}/{n}"}), flush=True)


def kev_solo(engine: kev.Engine, qs: list[dict[str, Any]], shape: str) -> list[tuple]:
    """Every question alone (tokens and logprobs), then all of them packed in another order: identical, bit for bit?"""
    with_logprobs = [{**q, "logprobs": 0} for q in qs]
    started = time.perf_counter()
    solo = [answers(engine.generate([q], timeout=600), True)[0] for q in with_logprobs]
    solo_s = time.perf_counter() - started
    order = list(range(len(qs)))
    random.Random(2).shuffle(order)
    packed = answers(engine.generate([with_logprobs[i] for i in order], timeout=600), True)
    same = sum(packed[k] == solo[i] for k, i in enumerate(order))
    print(json.dumps({"shape": shape, "path": "kev", "n": len(qs), "solo_seconds": round(solo_s, 1),
                      "identical_to_solo_tokens_and_logprobs": f"{same}/{len(qs)}"}), flush=True)
    return solo


def hf_model(model: LlamaModel) -> Any:
    """transformers' Llama on the very same weights (fused projections split back), on the same device and dtype."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = model.config
    hf_config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=model.max_positions)
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_config)
    hf = hf.to(dtype=model.dtype).to_empty(device=model.device).eval()
    state = {}
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qw, kw, vw = layer.self_attn.qkv_proj.weight.split([q, kv, kv])
        gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
        state |= {p + "self_attn.q_proj.weight": qw, p + "self_attn.k_proj.weight": kw,
                  p + "self_attn.v_proj.weight": vw, p + "self_attn.o_proj.weight": layer.self_attn.o_proj.weight,
                  p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                  p + "mlp.down_proj.weight": layer.mlp.down_proj.weight,
                  p + "input_layernorm.weight": layer.input_layernorm.weight,
                  p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight}
    state["model.embed_tokens.weight"] = model.embed_tokens.weight
    state["model.norm.weight"] = model.norm.weight
    state["lm_head.weight"] = (model.lm_head or model.embed_tokens).weight
    with torch.no_grad():
        for name, tensor in hf.state_dict().items():
            tensor.copy_(state[name])
    hf.model.rotary_emb = LlamaRotaryEmbedding(hf_config).to(model.device)  # its buffers: lost by to_empty
    hf.generation_config.eos_token_id = None  # 128 new tokens every time, as Kev's ignore_eos
    hf.generation_config.pad_token_id = 0
    return hf


def hf_generate(hf: Any, prompts: list[list[int]], max_tokens: int) -> tuple[list[tuple], float]:
    """A left-padded batch through transformers' own generate (greedy)."""
    device = hf.device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    sync(device)
    started = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                          do_sample=False)
    sync(device)
    return [(tuple(row[width:].tolist()), ()) for row in out], time.perf_counter() - started


def hf_path(model: LlamaModel, qs: list[dict[str, Any]], sizes: list[int], solo_count: int, shape: str,
            clock: Clock, kev_solo_answers: list[tuple]) -> None:
    hf = hf_model(model)
    prompts = [q["prompt_ids"] for q in qs]
    max_tokens = qs[0]["max_tokens"]
    solo = [hf_generate(hf, [p], max_tokens)[0][0] for p in prompts[:solo_count]] if clock.left() > 60 else []
    for n in sizes:
        if clock.left() < 20:
            print(json.dumps({"shape": shape, "path": "hf-generate-padded", "n": n, "skipped": "out of time"}))
            continue
        got, seconds = hf_generate(hf, prompts[:n], max_tokens)
        checked = min(n, len(solo))
        same = sum(got[i] == solo[i] for i in range(checked))
        as_kev = sum(got[i][0] == kev_solo_answers[i][0] for i in range(n))  # the weights are the same weights
        print(json.dumps({"shape": shape, "path": "hf-generate-padded", "n": n,
                          "tok_s": round(n * max_tokens / seconds, 1), "seconds": round(seconds, 2),
                          "identical_to_solo_tokens": f"{same}/{checked}", "same_tokens_as_kev_solo": f"{as_kev}/{n}"}),
              flush=True)
    del hf


def run_shape(shape: str, args: argparse.Namespace, tokenizer: Tokenizer, clock: Clock) -> None:
    device = pick_device(args.device)
    cfg = SHAPES[shape]
    max_context = max(args.lengths) + args.max_tokens + 16
    model = random_weights(cfg, DTYPES[args.precision], device, max_context)
    weight_bytes = model.weight_bytes()
    floor_ms = weight_bytes / STREAM_BYTES_PER_S * 1000
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(json.dumps({"shape": shape, "device": device_name, "precision": args.precision, "weight_gb": round(
        weight_bytes / 1e9, 2), "floor_ms": round(floor_ms, 3), "torch": torch.__version__}), flush=True)
    sizes = args.sizes
    qs = questions(max(sizes), cfg.vocab_size, args.max_tokens, args.lengths)
    engine = engine_for(model, tokenizer, max(sizes), max_context, True, args.linear, args.kernels, args.linear_tile)
    solo = kev_solo(engine, qs, shape)
    kev_path("kev", engine, qs, sizes, solo, floor_ms, shape, clock, args.repeats)
    engine.close()
    if args.off and clock.left() > 40:
        off = engine_for(model, tokenizer, max(sizes), max_context, False, args.linear, args.kernels, args.linear_tile)
        kev_path("kev-invariance-off", off, qs, sizes, solo, floor_ms, shape, clock, args.repeats)
        off.close()
    if args.hf and clock.left() > 40:
        hf_path(model, qs, sizes, args.hf_solo, shape, clock, solo)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="llama-1b,llama-8b")
    parser.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--sizes", default="1,16,64", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--lengths", default="5,40,130,300,600", type=lambda s: [int(x) for x in s.split(",")],
                        help="prompt lengths each question draws from")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--linear", default="cublas", choices=["cublas", "triton"], help="core.gpu_linear")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--off", action=argparse.BooleanOptionalAction, default=True,
                        help="also Kev with invariance off (one GEMM per bucket) on the same graphs")
    parser.add_argument("--hf-solo", type=int, default=8, help="questions transformers also answers alone")
    parser.add_argument("--linear-tile", type=int, default=64, help="core.linear_tile: rows per decode GEMM tile "
                        "(on a GPU a 64-row tile streams the weights once for up to 64 questions)")
    parser.add_argument("--repeats", type=int, default=30, help="graph replays timed per decode step figure")
    parser.add_argument("--kernels", default="auto", choices=["auto", "torch", "triton"], help="core.kernels")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--deadline-s", type=float, default=450)
    parser.add_argument("--tokenizer", help="a folder with tokenizer.json (default: the default model's)")
    parser.add_argument("--dry-run", action="store_true", help="llama-tiny, N=1,2, 4 tokens: the script runs")
    args = parser.parse_args()
    if args.dry_run:
        args.shapes, args.sizes, args.lengths, args.max_tokens, args.hf_solo = "llama-tiny", [1, 2], [5, 20], 4, 2
        args.repeats = 1
        if pick_device(args.device).type == "cpu" and triton_importable():  # the Triton path, interpreted
            os.environ["TRITON_INTERPRET"], args.kernels = "1", "triton"
    tokenizer = Tokenizer.from_folder(args.tokenizer or resolve_model_path("smollm2-135m-instruct"))
    clock = Clock(args.deadline_s)
    for shape in args.shapes.split(","):
        if clock.left() < 60:
            print(json.dumps({"shape": shape, "skipped": "out of time"}), flush=True)
            continue
        run_shape(shape, args, tokenizer, clock)


if __name__ == "__main__":
    main()
