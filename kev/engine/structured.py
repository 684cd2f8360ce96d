"""Structured output per channel, through llguidance.

A question may carry `structured_outputs`: exactly one of
  {"json": <JSON schema>}        any JSON value the schema accepts
  {"json_object": true}          any JSON object
  {"regex": "<regex>"}           text matching the regex
  {"choice": ["a", "b", ...]}    exactly one of the strings
  {"grammar": "<Lark or GBNF>"}  text of the grammar
(vLLM's `structured_outputs`). It is compiled when the question is submitted, before it takes a
channel, within GRAMMAR_COMPILE_SECONDS: a bad one, or one that can match no text at all, is that
question's error naming the field, with the first line of llguidance's reason (its full text, which
may hold the parser's state, goes to the server log with the request id).
The matcher it yields (ChannelGrammar) is the grammar state of the question's channel: it masks
that channel's logits row only, advances with that channel's tokens only, and is dropped when the
question finishes and gives its channel back. Rows of other channels are never touched.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np
import torch

from kev.errors import QuestionError
from kev.model.tokenizer import Tokenizer

log = logging.getLogger("kev.engine")
GRAMMAR_COMPILE_SECONDS = 10.0  # wall-clock limit to check and compile one constraint
KINDS = ("json", "json_object", "regex", "choice", "grammar")
_KIND_NAMES = {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice list",
               "grammar": "grammar"}
# llguidance's own work limits (its fuel units; see LLParserLimits) bound a hostile schema before the clock does.
_LIMITS: dict[str, Any] = {"initial_lexer_fuel": 2_000_000, "max_grammar_size": 500_000, "step_lexer_fuel": 400_000}


class GrammarCompiler:
    """Turns a structured_outputs spec into llguidance grammars and per-channel matchers for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int],
                 compile_seconds: float = GRAMMAR_COMPILE_SECONDS) -> None:
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, list(eos_token_ids)
        self.compile_seconds = compile_seconds
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="kev-grammar")

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:  # built once, on the first constrained question (about 0.3 s)
            if self._lltokenizer is None:
                self._lltokenizer = llguidance.LLTokenizer(self.tokenizer.to_json(), n_vocab=self.vocab_size,
                                                           eos_token=self.eos_token_ids)
            return self._lltokenizer

    def compile(self, spec: Any, where: str, request_id: str = "") -> CompiledGrammar:
        """The llguidance grammar of spec, checked; QuestionError naming `where` otherwise."""
        try:
            grammar = grammar_of(spec, where)
        except QuestionError as err:
            log.info("request %s: %s", request_id, err.__cause__ or err)  # llguidance's full text, when it spoke
            raise
        future = self._pool.submit(self._check, grammar)
        try:
            problem = future.result(timeout=self.compile_seconds)
        except FutureTimeout:  # the worker thread finishes on its own (llguidance's fuel limits bound it)
            raise QuestionError(f"{where}: compiling the constraint took longer than {self.compile_seconds:g} s") \
                from None
        if problem == _MATCHES_NOTHING:
            log.info("request %s: %s can match no text", request_id, where)
            raise QuestionError(f"{where}: the {_KIND_NAMES[next(iter(spec))]} can match no text")
        if problem:
            log.info("request %s: %s refused by llguidance: %s", request_id, where, problem)
            raise QuestionError(f"{where}: {first_line(problem)}")
        return CompiledGrammar(self, grammar)

    def start(self, grammar: str) -> ChannelGrammar:
        """A fresh matcher at the grammar's start: one per question, so per channel."""
        limits = llguidance.LLParserLimits(**_LIMITS)
        return ChannelGrammar(llguidance.LLMatcher(self.lltokenizer, grammar, limits=limits),
                              self.vocab_size, self.eos_token_ids)

    def _check(self, grammar: str) -> str:
        limits = llguidance.LLParserLimits(**_LIMITS)
        problem = llguidance.LLMatcher.validate_grammar(grammar, self.lltokenizer, limits=limits)
        if problem:
            return problem
        matcher = llguidance.LLMatcher(self.lltokenizer, grammar, limits=limits)
        if matcher.is_error():
            return matcher.get_error()
        # The first mask decides whether any text at all can start: a constraint that matches nothing (a regex
        # like [^\s\S]) leaves the matcher in error here, before the question ever takes a channel.
        matcher.compute_bitmask()
        return _MATCHES_NOTHING if matcher.is_error() else ""


# Where a regex's error sits in the one-rule grammar Kev wraps it in ("start: /.../"): not the caller's text.
_POSITION = re.compile(r"^at 1\(8\): ")
_MATCHES_NOTHING = "\0matches nothing"  # _check's answer for a constraint that cannot start any text


def first_line(text: str) -> str:
    """The reason llguidance gives, without the parser state or source excerpt it may print after it: its first
    line, completed by its `error: ...` line when the first ends at a colon (a regex parse error)."""
    lines = text.strip().splitlines() or [""]
    reason = lines[0].replace(" (in regex)", "")
    detail = next((line.strip().removeprefix("error: ") for line in lines[1:] if line.startswith("error: ")), None)
    if reason.endswith(":") and detail:
        reason = f"{reason[:-1]}: {detail}"
    return _POSITION.sub("", reason) if reason.startswith("at 1(8): invalid regex") else reason


class CompiledGrammar:
    """A checked grammar; start() gives each question (each channel) its own matcher."""

    def __init__(self, compiler: GrammarCompiler, grammar: str) -> None:
        self.compiler, self.grammar = compiler, grammar

    def start(self) -> ChannelGrammar:
        return self.compiler.start(self.grammar)


def grammar_of(spec: Any, where: str) -> str:
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise QuestionError(f"{where}: must be an object with exactly one of {', '.join(KINDS)}")
    kind, value = next(iter(spec.items()))
    if kind in ("json", "json_object"):
        if kind == "json_object":
            if value is not True:
                raise QuestionError(f"{where}.json_object: must be true")
            value = {"type": "object"}
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as err:
                raise QuestionError(f"{where}.json: the schema is not valid JSON ({err})") from None
        if not isinstance(value, dict):
            raise QuestionError(f"{where}.json: a JSON schema must be an object, got {type(value).__name__}")
        try:  # compact separators: a small model offered free whitespace can pad forever
            return llguidance.LLMatcher.grammar_from_json_schema(value, defaults={"whitespace_flexible": False})
        except (ValueError, TypeError) as err:
            raise QuestionError(f"{where}.json: {first_line(str(err))}") from err
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise QuestionError(f"{where}.choice: must be a non-empty list of non-empty strings")
        return llguidance.grammar_from("choice", value)  # type: ignore[arg-type]  # its stub says str; a list works
    if not isinstance(value, str) or not value:
        raise QuestionError(f"{where}.{kind}: must be a non-empty string")
    try:
        return llguidance.grammar_from("regex" if kind == "regex" else "grammar", value)
    except ValueError as err:
        raise QuestionError(f"{where}.{kind}: {first_line(str(err))}") from err


class ChannelGrammar:
    """One channel's grammar state: which tokens may come next, advanced by the channel's own tokens."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.matcher, self.vocab_size, self.eos_token_ids = matcher, vocab_size, eos_token_ids
        self._bitmask = llg_numpy.allocate_token_bitmask(1, vocab_size)  # [1, ceil(vocab / 32)] int32

    def allowed(self) -> torch.Tensor:
        """[vocab] bool: the tokens the grammar accepts next."""
        llg_numpy.fill_next_token_bitmask(self.matcher, self._bitmask, 0)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
        allowed = torch.from_numpy(bits.astype(bool))
        if not allowed.any():  # a matcher in error allows nothing: end the answer rather than sample from all -inf
            allowed[self.eos_token_ids] = True
        return allowed

    def constrain(self, row: torch.Tensor) -> torch.Tensor:
        """A copy of the logits row with every token the grammar forbids at -inf."""
        return row.masked_fill(~self.allowed().to(row.device), float("-inf"))

    def accept(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)

    @property
    def is_done(self) -> bool:
        """The grammar is complete and allows nothing more (it took EOS, or its text is whole)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None

    def dead_end(self, request_id: str, index: int, num_tokens: int) -> str:
        """The question's error when its constraint went wrong mid-answer: the caller's constraint (a branch that
        leads nowhere, seen only when reached, or one too costly to follow), named by its field; llguidance's full
        text, parser state included, goes to the log only."""
        error = self.error or ""
        log.info("request %s: queries[%d].structured_outputs failed after %d tokens: %s", request_id, index,
                 num_tokens, error)
        if "fuel" in first_line(error).lower() or "limit" in first_line(error).lower():
            return f"queries[{index}].structured_outputs: the constraint is too costly to follow (llguidance's " \
                   f"work limit, after {num_tokens} tokens)"
        return f"queries[{index}].structured_outputs: the constraint allows no text after {num_tokens} tokens"
