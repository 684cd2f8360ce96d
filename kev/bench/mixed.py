"""kev bench --scenario mixed: a batch like Kev's users send (document-extraction prompts among short
questions, natural EOS), Kev against vLLM's CPU build on the same prompt ids; wall time and
how many answers equal the same question asked alone, for each engine."""
from __future__ import annotations

import time
from typing import Any

from kev.bench.mixed_questions import mixed_questions
from kev.bench.throughput import model_folder, prompt_ids
from kev.bench.vllm_anchor import VllmBatch, run_vllm
from kev.engine.engine import Engine

LONG_PROMPTS, SHORT_PROMPTS = 32, 128


def run_mixed(engine: Engine, max_tokens: int, against_vllm: bool, num_long: int = LONG_PROMPTS,
              num_short: int = SHORT_PROMPTS) -> dict[str, Any]:
    questions = mixed_questions(num_long, num_short)
    prompts = [prompt_ids(engine, q) for q in questions]
    options: dict[str, Any] = {"max_tokens": max_tokens, "timeout_ms": 600_000}
    engine.generate(questions[:2], timeout=600, **{**options, "max_tokens": 2})  # warm-up
    started = time.perf_counter()
    answers = engine.generate(questions, timeout=3600, **options)
    kev_seconds = time.perf_counter() - started
    solo = [engine.generate([q], timeout=3600, **options)[0].token_ids for q in questions]
    rows: list[dict[str, Any]] = [{"path": "kev", "questions": len(questions),
                                   "completion_tokens": sum(a.completion_tokens for a in answers),
                                   "seconds": round(kev_seconds, 3),
                                   "identical_to_solo": f"{sum(a.token_ids == s for a, s in zip(answers, solo))}/"
                                                        f"{len(questions)}"}]
    if against_vllm:
        out = run_vllm(model_folder(engine), engine.config.core.resolved_precision, engine.config.core.max_context,
                       [VllmBatch("mixed", prompts, max_tokens, False)], solo="mixed")
        batch = out["batches"][0]
        same = sum(a == s for a, s in zip(batch["token_ids"], out["solo"]))
        rows.append({"path": "vllm", "questions": len(questions),
                     "completion_tokens": sum(len(t) for t in batch["token_ids"]),
                     "seconds": round(batch["seconds"], 3), "identical_to_solo": f"{same}/{len(questions)}"})
    for row in rows:
        row["tok_per_s"] = round(row["completion_tokens"] / row["seconds"], 1)
        row["kev_time_over_path"] = round(kev_seconds / row["seconds"], 2)
    return {"scenario": "mixed", "long_prompts": num_long, "short_prompts": num_short,
            "prompt_tokens": [min(len(p) for p in prompts), max(len(p) for p in prompts)], "rows": rows}
