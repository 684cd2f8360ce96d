"""From submit()'s arguments to Questions: request-level checks (raise) and per-question checks (error results)."""
from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import Any

from kev.results.result import Result, question_field
from kev.config import KevConfig
from kev.config.schema import ISOLATION_ORDER
from kev.config.server_config import DEFAULT_TENANT, TENANT_NAME
from kev.config.sharing_config import WORK_CLASSES
from kev.engine.inputs import QuestionSpec, RequestDefaults, parse_question, request_sampling, validate_timeout
from kev.engine.question import Question
from kev.engine.sampling_params import SamplingParams
from kev.engine.shared_starts import group_shared_starts
from kev.engine.structured import CompiledGrammar, GrammarCompiler
from kev.errors import CONTEXT_OVERFLOW, ContextOverflowError, InvalidRequestError, QuestionError
from kev.model.tokenizer import Tokenizer
from kev.router.features import QuestionFeatures
from kev.router.normalize import Normalizer
from kev.router.router import Router


@dataclass(frozen=True)
class SubmitOptions:
    isolation: str
    max_parallel: int
    defaults: RequestDefaults
    tenant: str = DEFAULT_TENANT  # whose request: loose caches its private prefixes for this tenant only
    work_class: str = "live"  # live, or batch: a server batch's lines (kev/engine/fair_share.py)

    @classmethod
    def validate(cls, config: KevConfig, isolation: str | None, max_parallel: int | None, timeout_ms: int | None,
                 system: str | None, sampling: SamplingParams, tenant: str | None = None,
                 work_class: str | None = None) -> SubmitOptions:
        level = isolation or config.isolation.level
        if level not in ISOLATION_ORDER:
            raise InvalidRequestError(f"isolation: unknown level {level!r} (strict, shared, loose)")
        if ISOLATION_ORDER[level] > ISOLATION_ORDER[config.isolation.level]:
            raise InvalidRequestError(f"isolation: {level!r} is looser than the configured cap "
                                      f"isolation.level={config.isolation.level!r}")
        cap = config.router.max_parallel_queries
        is_count = isinstance(max_parallel, int) and not isinstance(max_parallel, bool)
        if max_parallel is not None and (not is_count or max_parallel < 1):
            raise InvalidRequestError(f"max_parallel: must be a positive integer, got {max_parallel!r}")
        if not isinstance(sampling, SamplingParams):
            raise InvalidRequestError(f"sampling: must be a SamplingParams, got {type(sampling).__name__}")
        try:
            params = request_sampling(sampling, config.router.default_max_tokens, config.router.max_tokens_cap)
            timeout = validate_timeout(config.router.default_timeout_ms if timeout_ms is None else timeout_ms,
                                       config.router.timeout_ms_cap, "")
        except QuestionError as err:
            raise InvalidRequestError(str(err)) from None
        if system is not None and not isinstance(system, str):
            raise InvalidRequestError(f"system: must be a string, got {type(system).__name__}")
        if tenant is not None and not (isinstance(tenant, str) and TENANT_NAME.match(tenant)):
            raise InvalidRequestError(f"tenant: {tenant!r} is not a tenant name (letters, digits, '_', '.', '-'; "
                                      "at most 64)")
        if work_class is not None and work_class not in WORK_CLASSES:
            raise InvalidRequestError(f"work_class: {work_class!r} is not one of {', '.join(WORK_CLASSES)}")
        defaults = RequestDefaults(params, config.router.max_tokens_cap, timeout,
                                   system or config.isolation.system_prompt,
                                   system_is_public=system is None and config.isolation.system_prompt is not None,
                                   timeout_ms_cap=config.router.timeout_ms_cap)
        return cls(level, min(max_parallel or cap, cap), defaults, tenant or DEFAULT_TENANT, work_class or "live")


@dataclass
class ReadQuestion:
    """One valid question, parsed, normalized, tokenized and described for the router."""

    index: int
    raw: Any
    spec: QuestionSpec
    prompt_ids: list[int]
    normalized: str | None
    features: QuestionFeatures
    grammar: CompiledGrammar | None = None


@dataclass
class RefusedQuestion:
    """A question whose own input is wrong: its error result, and the error it raised."""

    result: Result
    error: QuestionError

    @property
    def overflows_context(self) -> bool:
        return isinstance(self.error, ContextOverflowError)


def read_questions(queries: list[Any], request_id: str, options: SubmitOptions, tokenizer: Tokenizer,
                   config: KevConfig, vocab_size: int, router: Router,
                   grammars: GrammarCompiler | None = None) -> tuple[list[ReadQuestion], list[RefusedQuestion]]:
    """The per-question checks every submit path makes (engine, router): a bad question becomes its error result."""
    read: list[ReadQuestion] = []
    errors: list[RefusedQuestion] = []
    for index, raw in enumerate(queries):
        try:
            spec = parse_question(raw, index, options.defaults)
            normalized = normalize_question(spec, router.normalizer)
            prompt_ids = tokenize_question(spec, tokenizer, index, config.core.max_context, vocab_size)
            grammar = _compile(spec, grammars, index, request_id)
            _check_bias(spec, index, vocab_size)
        except QuestionError as err:
            result = Result(request_id, index, status="error", finish_reason="error", error=str(err),
                            error_field=question_field(str(err)),
                            isolation=options.isolation, original_text=raw if isinstance(raw, str) else None,
                            strategy=router.strategy_name)
            errors.append(RefusedQuestion(result, err))
            continue
        text = (spec.original_text or "") if normalized is None else normalized
        read.append(ReadQuestion(index, raw, spec, prompt_ids, normalized, router.describe(text, len(prompt_ids)),
                                 grammar))
    return read, errors


def _check_bias(spec: QuestionSpec, index: int, vocab_size: int) -> None:
    outside = next((t for t, _ in spec.sampling.logit_bias if t >= vocab_size), None)
    if outside is not None:
        raise QuestionError(f"queries[{index}].logit_bias: token id {outside} is outside the vocabulary "
                            f"(0..{vocab_size - 1})")


def _compile(spec: QuestionSpec, grammars: GrammarCompiler | None, index: int,
             request_id: str) -> CompiledGrammar | None:
    if spec.sampling.structured_outputs is None or grammars is None:
        return None  # grammars None: a distributed router; the worker's engine compiles (and checks) it
    return grammars.compile(spec.sampling.structured_outputs, f"queries[{index}].structured_outputs", request_id)


def build_questions(queries: list[Any], request_id: str, options: SubmitOptions, tokenizer: Tokenizer,
                    config: KevConfig, vocab_size: int, router: Router, grammars: GrammarCompiler | None = None,
                    group_starts: bool = False) -> tuple[list[Question], list[RefusedQuestion]]:
    """group_starts: the engine's numerics let questions sharing a long start compute it once (shared_starts.py)."""
    read, errors = read_questions(queries, request_id, options, tokenizer, config, vocab_size, router, grammars)
    questions: list[Question] = []
    for r in read:
        q = _question(r.spec, r.prompt_ids, request_id, r.index, options.isolation)
        q.shadow = random.random() < config.isolation.shadow_rate
        q.tenant, q.work_class = options.tenant, options.work_class
        if r.grammar is not None:
            q.grammar_spec, q.grammar = r.grammar, r.grammar.start()
        # Prompt logprobs need every prompt row computed in the question's own channel: no attached prefix.
        if config.isolation.shared_prefix and options.defaults.system and r.spec.messages \
                and not r.spec.sampling.prompt_logprobs:
            q.prefix_ids = _prefix_ids(tokenizer, options.defaults.system, r.prompt_ids)
            q.prefix_public = options.defaults.system_is_public
        q.normalized_text = r.normalized
        q.features = r.features
        questions.append(q)
    if group_starts and config.isolation.shared_prefix and len(questions) > 1:
        group_shared_starts(questions)
    return questions, errors


def normalize_question(spec: QuestionSpec, normalizer: Normalizer) -> str | None:
    """Normalize the question (the last user message) in place; raw prompts are used as they are."""
    if not spec.messages or spec.messages[-1]["role"] != "user":
        return None
    spec.messages[-1]["content"] = normalizer.normalize(spec.messages[-1]["content"])
    return spec.messages[-1]["content"]


def _prefix_ids(tokenizer: Tokenizer, system: str, prompt_ids: list[int]) -> list[int]:
    """The tokens of the rendered system turn, when they are exactly the start of the prompt."""
    text = tokenizer.render_chat([{"role": "system", "content": system}], add_generation_prompt=False)
    ids = tokenizer.encode(text)
    return ids if 0 < len(ids) < len(prompt_ids) and prompt_ids[: len(ids)] == ids else []


def tokenize_question(spec: QuestionSpec, tokenizer: Tokenizer, index: int, max_context: int,
                      vocab_size: int) -> list[int]:
    if spec.prompt_ids is not None:
        ids = spec.prompt_ids
        outside = next((i for i, t in enumerate(ids) if t >= vocab_size), None)
        if outside is not None:
            raise QuestionError(f"queries[{index}].prompt_ids[{outside}]: token id {ids[outside]} is outside the "
                                f"vocabulary (0..{vocab_size - 1})")
    elif spec.raw_prompt is not None:
        ids = tokenizer.encode(spec.raw_prompt)
    elif tokenizer.has_chat_template:
        ids = tokenizer.encode(tokenizer.render_chat(spec.messages or [], add_generation_prompt=True))
    else:
        ids = tokenizer.encode("\n".join(m["content"] for m in spec.messages or []))
    if len(ids) >= max_context:
        raise ContextOverflowError(f"queries[{index}]: prompt has {len(ids)} tokens; core.max_context is {max_context} "
                                   f"({CONTEXT_OVERFLOW})")
    return ids


def _question(spec: QuestionSpec, prompt_ids: list[int], request_id: str, index: int, isolation: str) -> Question:
    seed = None
    if not spec.sampling.is_greedy:
        seed = spec.sampling.seed if spec.sampling.seed is not None else secrets.randbits(62)
    return Question(request_id, index, prompt_ids, spec.sampling, spec.timeout_ms, spec.priority, isolation,
                    spec.original_text, seed=seed)


def new_request_id() -> str:
    """128 bits from the OS's CSPRNG: an id another caller can neither guess nor enumerate."""
    return secrets.token_hex(16)
