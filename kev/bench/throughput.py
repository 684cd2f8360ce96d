"""kev bench: Kev one-forward vs Kev serial vs Hugging Face left-padded batch, side by side in one run.

Serial time for N questions is the sum of the first N solo runs (each solo run is also
the reference answer). Every path generates exactly max_tokens per question (EOS ignored)
so tokens/s compare like with like.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kev.bench.linear_bound import linear_stack_ms
from kev.bench.questions import BENCH_QUESTIONS
from kev.bench.vllm_anchor import VllmBatch, run_vllm
from kev.engine.engine import Engine
from kev.model.llama import LlamaModel


@dataclass
class PathResult:
    n: int
    path: str  # "kev" | "serial" | "hf_batch" | "vllm" | "llamacpp" | "kev_non_invariant" | "kev_<precision>"
    tokens: int
    seconds: float
    identical_to_solo: str

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3), "tok_per_s": round(self.tok_per_s, 2)}


def run_throughput(engine: Engine, sizes: list[int], max_tokens: int, hf_model: Any | None,
                   fused: Engine | None = None, against_vllm: bool = False,
                   on_progress: Callable[[str, float, float], None] | None = None,
                   other_precision: Engine | None = None, against_llamacpp: bool = False) -> dict[str, Any]:
    """fused: the same engine with batch_invariant off, run at the largest N to price invariance.
    against_vllm: vLLM's CPU build on the same prompt ids, in its own process (bench/vllm_runner.py).
    other_precision: Kev at another core.precision (its own weights), at every N beside the first, its answers
    against its own solo answers (path kev_<precision>).
    against_llamacpp: llama.cpp's llama-server on the same GGUF and prompt ids (kev/bench/llamacpp_anchor.py).
    on_progress(label, runs done, runs in all): after each solo question and each N."""
    questions = (BENCH_QUESTIONS * (max(sizes) // len(BENCH_QUESTIONS) + 1))[: max(sizes)]
    options: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True, "timeout_ms": 600_000}
    total = len(questions) + len(sizes) + (fused is not None) + (other_precision is not None) * len(sizes)
    tick = on_progress or (lambda label, done, total: None)
    tick("warm-up", 0, total)
    engine.generate(questions[:2], timeout=600, **{**options, "max_tokens": 2})  # warm-up
    solo_ids: list[list[int]] = []
    solo_seconds: list[float] = []
    for q in questions:
        tick(f"solo question {len(solo_ids) + 1}/{len(questions)}", len(solo_ids), total)
        started = time.perf_counter()
        solo_ids.append(engine.generate([q], timeout=3600, **options)[0].token_ids)
        solo_seconds.append(time.perf_counter() - started)
    prompts = [prompt_ids(engine, q) for q in questions]
    hf_solo = [_hf_generate(hf_model, [p], max_tokens)[0][0] for p in prompts] if hf_model is not None else []
    results: list[PathResult] = []
    steps: dict[str, dict[str, float]] = {}
    for i, n in enumerate(sizes):
        tick(f"N={n}: kev" + (" and HF batch" if hf_model is not None else ""), len(questions) + i, total)
        first_step = engine.stats.num_steps
        started = time.perf_counter()
        answers = engine.generate(questions[:n], timeout=3600, **options)
        seconds = time.perf_counter() - started
        steps[str(n)] = _decode_step_vs_bound(engine, n, engine.stats.num_steps - first_step)
        same = sum(a.token_ids == s for a, s in zip(answers, solo_ids))
        results.append(PathResult(n, "kev", sum(a.completion_tokens for a in answers), seconds, f"{same}/{n}"))
        results.append(PathResult(n, "serial", n * max_tokens, sum(solo_seconds[:n]), f"{n}/{n}"))
        if hf_model is not None:
            ids, seconds = _hf_generate(hf_model, prompts[:n], max_tokens)
            same = sum(a == s for a, s in zip(ids, hf_solo))
            results.append(PathResult(n, "hf_batch", n * max_tokens, seconds, f"{same}/{n}"))
    if against_vllm:
        results += _vllm_paths(engine, sizes, prompts, max_tokens)
    if against_llamacpp:
        tick("llama.cpp (llama-server, --parallel N)", len(questions) + len(sizes), total)
        results += _llamacpp_paths(engine, sizes, prompts, max_tokens)
    if other_precision is not None:
        results += _other_precision_paths(other_precision, questions, sizes, options, steps,
                                          lambda label, i: tick(label, len(questions) + len(sizes) + i, total))
    ratios = _ratios(results, sizes)
    if fused is not None:
        n = max(sizes)
        tick(f"N={n}: batch_invariant off (its cost)", total - 1, total)
        fused.generate(questions[:2], timeout=600, **{**options, "max_tokens": 2})
        started = time.perf_counter()
        answers = fused.generate(questions[:n], timeout=3600, **options)
        seconds = time.perf_counter() - started
        same = sum(a.token_ids == s for a, s in zip(answers, solo_ids))
        num_tokens = sum(a.completion_tokens for a in answers)
        results.append(PathResult(n, "kev_non_invariant", num_tokens, seconds, f"{same}/{n}"))
        kev_rate = next(r.tok_per_s for r in results if r.n == n and r.path == "kev")
        ratios[str(n)]["kev_over_non_invariant"] = round(kev_rate / results[-1].tok_per_s, 2)
    return {"results": [r.to_dict() for r in results], "ratios": ratios, "decode_steps": steps}


def _other_precision_paths(engine: Engine, questions: list[str], sizes: list[int], options: dict[str, Any],
                           steps: dict[str, dict[str, float]], tick: Callable[[str, int], None]) -> list[PathResult]:
    path = f"kev_{engine.config.core.resolved_precision}"
    engine.generate(questions[:2], timeout=600, **{**options, "max_tokens": 2})  # warm-up
    results = []
    for i, n in enumerate(sizes):
        tick(f"N={n}: {path}", i)
        first_step = engine.stats.num_steps
        started = time.perf_counter()
        answers = engine.generate(questions[:n], timeout=3600, **options)
        seconds = time.perf_counter() - started
        steps[f"{n} {path}"] = _decode_step_vs_bound(engine, n, engine.stats.num_steps - first_step)
        solo = [engine.generate([q], timeout=3600, **options)[0].token_ids for q in questions[:n]]
        same = sum(a.token_ids == s for a, s in zip(answers, solo))
        results.append(PathResult(n, path, sum(a.completion_tokens for a in answers), seconds, f"{same}/{n}"))
    return results


def _decode_step_vs_bound(engine: Engine, n: int, num_steps: int) -> dict[str, float]:
    """Median step of the batch's pure decode steps (n tokens, n sampled) against the linear layers alone."""
    records = list(engine.stats.recent)[-num_steps:] if num_steps else []
    decode = [r.step_ms for r in records if r.num_tokens == n and r.num_sampled == n]
    step_ms = statistics.median(decode) if decode else 0.0
    if engine.config.core.tensor_parallel > 1:  # a shard's linears sum over ranks that would not join: no bound
        return {"step_ms": round(step_ms, 2), "linear_bound_ms": 0.0, "bound_share": 0.0}
    bound_ms = linear_stack_ms(engine.runner.model, max(n, engine.runner.tiling.min_rows))
    return {"step_ms": round(step_ms, 2), "linear_bound_ms": round(bound_ms, 2),
            "bound_share": round(bound_ms / step_ms, 2) if step_ms else 0.0}


def _vllm_paths(engine: Engine, sizes: list[int], prompts: list[list[int]], max_tokens: int) -> list[PathResult]:
    batches = [VllmBatch(f"n{n}", prompts[:n], max_tokens, True) for n in sizes]
    out = run_vllm(model_folder(engine), engine.config.core.resolved_precision, engine.config.core.max_context,
                   batches, solo=f"n{max(sizes)}")
    results = []
    for n, batch in zip(sizes, out["batches"]):
        same = sum(a == s for a, s in zip(batch["token_ids"], out["solo"]))
        results.append(PathResult(n, "vllm", sum(len(t) for t in batch["token_ids"]), batch["seconds"], f"{same}/{n}"))
    return results


def _llamacpp_paths(engine: Engine, sizes: list[int], prompts: list[list[int]], max_tokens: int) -> list[PathResult]:
    from kev.bench.llamacpp_anchor import run_llamacpp
    from kev.model.model_store import gguf_source

    gguf = gguf_source(engine.config.core.model_path)
    if gguf is None:
        raise SystemExit("--against llamacpp needs a .gguf model (core.model_path is a Hugging Face folder)")
    out = run_llamacpp(gguf, sizes, prompts, max_tokens, torch.get_num_threads())
    results = []
    for batch in out["batches"]:
        n = batch["n"]
        same = sum(a == s for a, s in zip(batch["token_ids"], out["solo"]))
        results.append(PathResult(n, "llamacpp", sum(len(t) for t in batch["token_ids"]), batch["seconds"],
                                  f"{same}/{n}"))
    return results


def model_folder(engine: Engine) -> Path:
    from kev.model.model_store import resolve_model_path

    return resolve_model_path(engine.config.core.model_path)


def prompt_ids(engine: Engine, question: str) -> list[int]:
    text = engine.tokenizer.render_chat([{"role": "user", "content": question}], add_generation_prompt=True)
    return engine.tokenizer.encode(text)


def _hf_generate(model: Any, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """Naive batching: left-pad to the longest prompt, one generate() call."""
    width = max(len(p) for p in prompts)
    pad = 2
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad)
    seconds = time.perf_counter() - started
    return [row[width:].tolist() for row in out], seconds


def _ratios(results: list[PathResult], sizes: list[int]) -> dict[str, dict[str, float]]:
    ratios: dict[str, dict[str, float]] = {}
    for n in sizes:
        by_path = {r.path: r.tok_per_s for r in results if r.n == n}
        ratios[str(n)] = {"kev_over_serial": round(by_path["kev"] / by_path["serial"], 2)}
        for anchor in ("hf_batch", "vllm", "llamacpp"):
            if anchor in by_path:
                ratios[str(n)][f"kev_over_{anchor}"] = round(by_path["kev"] / by_path[anchor], 2)
        for other in (path for path in by_path if path.startswith("kev_") and path != "kev_non_invariant"):
            ratios[str(n)][f"{other}_over_kev"] = round(by_path[other] / by_path["kev"], 2)
    return ratios


def load_hf_reference(engine: Engine) -> Any | None:
    """transformers on the same weights and dtype, or None when transformers is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    model: LlamaModel = engine.runner.model
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_folder(engine), dtype=model.dtype)
    return hf.eval()
