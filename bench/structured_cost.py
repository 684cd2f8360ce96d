"""What a constrained channel costs per token, in a batch (README: "Structured output").

Runs the same 8 questions twice on the default model (greedy, in one engine): all free, then with
4 of them constrained to a JSON schema. Prints the grammar's own time per constrained token
(mask + advance, measured around ChannelGrammar) and the mean step time of both runs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/structured_cost.py
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import torch

import kev
from kev.engine.structured import ChannelGrammar

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 24},
                                           "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                                       "maxItems": 3}},
          "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
QUESTIONS = ["Describe a person.", "Invent a character for a novel.", "Who lives next door?", "Describe a chef.",
             "Tell me about a pilot.", "Describe a teacher.", "Who is your favourite singer?", "Describe a farmer."]


class Timer:
    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def wrap(self, fn):  # noqa: ANN001, ANN201
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return timed


def run(engine: kev.Engine, questions: list, max_tokens: int) -> tuple[float, int, list]:
    steps_before, started = engine.num_steps, time.perf_counter()
    results = engine.generate(questions, max_tokens=max_tokens, timeout=3600)
    return (time.perf_counter() - started) / (engine.num_steps - steps_before), engine.num_steps - steps_before, results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engine = kev.Engine.from_config({"router": {"strategy": "round_robin", "max_parallel_queries": 8},
                                     "aggregator": {"timeout_ms": 600_000}}, background=False)
    mask, advance = Timer(), Timer()
    ChannelGrammar.constrain = mask.wrap(ChannelGrammar.constrain)  # type: ignore[method-assign]
    ChannelGrammar.accept = advance.wrap(ChannelGrammar.accept)  # type: ignore[method-assign]
    run(engine, QUESTIONS[:2], 4)  # warm-up (builds the grammar tokenizer table)
    mask.seconds = advance.seconds = 0.0
    free_step, free_steps, _ = run(engine, QUESTIONS, args.max_tokens)
    mixed = [{"text": q, "structured_outputs": {"json": SCHEMA}} if i % 2 else q for i, q in enumerate(QUESTIONS)]
    mixed_step, mixed_steps, results = run(engine, mixed, args.max_tokens)
    constrained_tokens = sum(r.completion_tokens for i, r in enumerate(results) if i % 2)
    valid = sum(1 for i, r in enumerate(results) if i % 2 and _parses(r.text))
    per_token_us = (mask.seconds + advance.seconds) / constrained_tokens * 1e6
    print(json.dumps({
        "machine": f"{platform.machine()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}",
        "dtype": str(engine.runner.dtype), "numerics_fingerprint": engine.runner.fingerprint,
        "batch": len(QUESTIONS), "constrained": len(QUESTIONS) // 2, "constrained_tokens": constrained_tokens,
        "valid_json": f"{valid}/{len(QUESTIONS) // 2}",
        "grammar_us_per_constrained_token": round(per_token_us, 1),
        "mask_us_per_token": round(mask.seconds / constrained_tokens * 1e6, 1),
        "advance_us_per_token": round(advance.seconds / constrained_tokens * 1e6, 1),
        "step_ms_all_free": round(free_step * 1000, 2), "steps_all_free": free_steps,
        "step_ms_half_constrained": round(mixed_step * 1000, 2), "steps_half_constrained": mixed_steps,
    }, indent=1))
    engine.close()


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    main()
