"""The router's half of submit(): the same checks as the engine's, so a bad request fails at the edge
(HTTP 422, or an error result for the one bad question) exactly as in single mode, and the
features (length, semantic bucket, category) the placement routes on.

The question travels as the caller gave it and the worker's engine parses it again: one code
path makes the answer, and it is the single-mode one. A sampled question without a seed gets
one here, so a redelivered question gives the same answer on any worker.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from kev.results.result import Result
from kev.config import KevConfig
from kev.engine.sampling_params import SamplingParams
from kev.engine.submission import SubmitOptions, read_questions
from kev.model.tokenizer import Tokenizer
from kev.router.features import QuestionFeatures
from kev.router.router import Router


@dataclass
class Prepared:
    index: int
    question: Any  # what goes on the queue
    features: QuestionFeatures
    priority: int
    timeout_ms: int | None  # None: no deadline
    original_text: str | None


def validate_options(config: KevConfig, sampling: SamplingParams, options: dict[str, Any]) -> SubmitOptions:
    """Request-level checks of Engine.submit (InvalidRequestError naming the field)."""
    return SubmitOptions.validate(config, options.get("isolation"), options.get("max_parallel"),
                                  options.get("timeout_ms"), options.get("system"), sampling, options.get("tenant"),
                                  options.get("work_class"))


def prepare(queries: list[Any], request_id: str, submit: SubmitOptions, config: KevConfig, tokenizer: Tokenizer,
            vocab_size: int, router: Router) -> tuple[list[Prepared], list[Result]]:
    """Per question: a Prepared to publish, or an error result (as the engine would have made it)."""
    read, refused = read_questions(queries, request_id, submit, tokenizer, config, vocab_size, router)
    errors = [r.result for r in refused]
    for result in errors:
        result.started_at = result.finished_at = time.time()
    prepared: list[Prepared] = []
    for r in read:
        question = r.raw
        if not r.spec.sampling.is_greedy and r.spec.sampling.seed is None:
            question = with_seed(r.raw, secrets.randbits(62))
        prepared.append(Prepared(r.index, question, r.features, r.spec.priority, r.spec.timeout_ms,
                                 r.spec.original_text))
    return prepared, errors


def with_seed(raw: Any, seed: int) -> dict[str, Any]:
    """The same question as a dict with a seed: parse_question reads all three forms the same way."""
    if isinstance(raw, str):
        return {"text": raw, "seed": seed}
    if isinstance(raw, list):
        return {"messages": raw, "seed": seed}
    return {**raw, "seed": seed}
