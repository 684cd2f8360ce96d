"""Extraction at one N, plain and with prompt-lookup drafts in turn, in one process (issue 41: drafts never slower than
plain): a run-to-run swing of the machine shows as a swing in both, not as a verdict on drafts. Prints each run's
seconds, steps and drafted tokens.

    .venv/bin/python bench/drafts_alternate.py --size 64 --rounds 3
"""
from __future__ import annotations

import argparse

from kev.bench.extraction_scenario import OFF, _run, questions
from kev.config import load_config
from kev.engine.engine import Engine
from kev.engine.engine_setup import build_parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    config = load_config(None, {"router": {"max_parallel_queries": args.size, "channel_pool_size": args.size,
                                           "strategy": "round_robin"}, "core": {"max_context": 1024}})
    plain = Engine(config, background=False)
    drafted_config = load_config(plain.config, {"speculative": {"max_step_rows": 8}})
    drafted = Engine(drafted_config, build_parts(drafted_config, plain.runner.model, plain.tokenizer),
                     background=False)
    spec = plain.config.speculative
    on = {"method": "prompt_lookup", "max_draft": spec.max_draft, "min_match": spec.min_match,
          "max_match": spec.max_match}
    pool = questions(args.size)
    for engine in (plain, drafted):
        engine.generate(["warm up"], max_tokens=2, timeout=600)
    try:
        for _ in range(args.rounds):
            for name, engine, speculative in (("plain", plain, OFF), ("drafts", drafted, on)):
                run = _run(engine, pool, speculative, args.max_tokens)
                print(f"{name}: {run['seconds']:.2f} s, {run['steps']} steps, {run['drafted']} drafted", flush=True)
    finally:
        drafted.close()
        plain.close()


if __name__ == "__main__":
    main()
