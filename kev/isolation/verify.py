"""Verify isolation: every answer in a random mix equals its solo run, bit for bit, and no secret leaks.

Procedure (docs/isolation-proofs.md):
1. Run each question alone (and a canary question carrying a fresh secret): the reference
   tokens and per-step fp32 logits.
2. Run `trials` mixes. Each mix shuffles the questions, interleaves a random number of short
   filler questions (random max_tokens, so they free their channels at different steps) and
   submits the mix in two parts with a random number of engine steps between them, so some
   questions join while others decode. Channels are handed out round-robin from a cursor that
   carries over, so the same question lands in different channels from trial to trial.
3. The last mix also carries the canary; its secret must appear in no other answer.
4. Compare token ids and logits with torch.equal, and the logprobs (top 5 per new token; in strict
   also every prompt token's) for equality; max |delta logit| shows how far apart they are.

Speculative mode (`kev verify --speculative`): the solo references decode plainly (drafts off) and every mix
decodes with prompt-lookup drafts, so each comparison proves a drafted, packed answer equal to the plain solo one;
extraction questions (answers that copy their prompt) join the set so drafts are proposed and accepted.
"""
from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kev.results.result import Result
from kev.engine.engine import Engine

VERIFY_QUESTIONS: list[str] = [
    "解释一下注意力机制",
    "注意力机制有什么缺点",
    "Hi",
    "What is the capital of France? Answer in one word.",
    "写出一个Python快速排序示例",
    "Summarise in two sentences why the sky looks blue during the day and red at sunset, mentioning "
    "Rayleigh scattering, the path length of sunlight through the atmosphere, and why clouds look white "
    "while the sea often looks blue or green on a sunny day.",
]
# Questions whose answers copy spans of their own prompt: what prompt-lookup drafts are for.
EXTRACTION_QUESTIONS: list[str] = [
    "Invoice 4471 was issued by Harbor Lane Supplies to Maple Street Bakery on 12 March 2024. The total amount "
    "due is 1,284.50 euros, payable within 30 days. Copy the sentence that gives the total amount due.",
    "Meeting notes: the launch moves to 9 June; Priya Raman owns the press release; the budget stays at 40,000 "
    "dollars. Repeat the notes word for word.",
]
DRAFTS_OFF = {"method": "off"}
DRAFTS_ON = {"method": "prompt_lookup"}  # the config's max_draft and match lengths
FILLERS: list[str] = ["OK?", "Say yes.", "2+2=?", "Name a colour.", "你好", "Count to three."]
# The common system prompt under shared/loose, so there is a shared prefix to test.
DEFAULT_SYSTEM = "You are a careful technical assistant. Answer briefly and precisely."
TIMEOUT_MS = 600_000  # a proof run must not lose questions to the serving timeout
TOP_LOGPROBS = 5


@dataclass(frozen=True)
class VerifyOptions:
    questions: list[str]
    trials: int = 3
    level: str = "strict"
    max_tokens: int = 6
    system: str | None = None  # passed with every question (None: the config's system prompt, if any)
    max_fillers: int = 4
    max_late_steps: int = 3  # steps between a mix's two submits
    seed: int | None = None  # seeds mixes; None draws one (reported, so a failure can be replayed)
    speculative: bool = False  # solo references without drafts, every mix with prompt-lookup drafts


@dataclass
class QuestionCheck:
    question: str
    solo_tokens: int
    trials: int = 0
    identical: int = 0
    max_abs_logit_diff: float = 0.0
    channels: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def record(self, result: Result, solo: Result) -> None:
        self.trials += 1
        if result.channel_id is not None:
            self.channels.add(result.channel_id)
        same, diff, problem = compare(result, solo)
        self.identical += same
        self.max_abs_logit_diff = max(self.max_abs_logit_diff, diff)
        if problem:
            self.problems.append(problem)


@dataclass
class VerifyReport:
    level: str
    numerics_fingerprint: str
    seed: int
    canary: str
    trials: int
    checks: list[QuestionCheck]
    canary_check: QuestionCheck
    leaks: list[str] = field(default_factory=list)  # the other answers that contain the secret
    speculative: bool = False
    drafted_tokens: int = 0  # speculative mode: tokens the mixes drafted ...
    accepted_tokens: int = 0  # ... and the model sampled itself

    @property
    def identical(self) -> int:
        return sum(c.identical for c in self.checks)

    @property
    def comparisons(self) -> int:
        return sum(c.trials for c in self.checks)

    @property
    def max_abs_logit_diff(self) -> float:
        return max([c.max_abs_logit_diff for c in [*self.checks, self.canary_check]], default=0.0)

    @property
    def ok(self) -> bool:
        """Every answer identical to its solo run and no leak; in speculative mode some draft was also accepted (a
        proof in which no draft ran would prove nothing about drafts)."""
        checked = [*self.checks, self.canary_check]
        drafted = not self.speculative or self.accepted_tokens > 0
        return not self.leaks and drafted and all(c.identical == c.trials > 0 for c in checked)

    def to_dict(self) -> dict[str, Any]:
        diff = self.max_abs_logit_diff
        return {"questions": len(self.checks), "trials": self.trials, "comparisons": self.comparisons,
                "identical": self.identical, "max_abs_logit_diff": diff if math.isfinite(diff) else None,
                "canary_leaks": len(self.leaks), "canary_identical": self.canary_check.identical == 1,
                "level": self.level, "numerics_fingerprint": self.numerics_fingerprint, "seed": self.seed,
                **({"speculative": True, "drafted_tokens": self.drafted_tokens, "accepted_tokens": self.accepted_tokens}
                   if self.speculative else {}),
                "ok": self.ok}


@dataclass(frozen=True)
class MixItem:
    text: str
    max_tokens: int
    is_filler: bool = False


def run_verify(engine: Engine, options: VerifyOptions,
               on_progress: Callable[[str, float, float], None] | None = None) -> VerifyReport:
    """engine: built with record_logits=True and background=False (verify drives its steps).
    on_progress(label, runs done, runs in all): before each solo reference and each mix."""
    if not engine.record_logits or engine.is_background:
        raise ValueError("verify needs an engine built with record_logits=True and background=False")
    if options.trials < 1 or not options.questions:
        raise ValueError("verify needs at least one question and one trial")
    seed = options.seed if options.seed is not None else secrets.randbits(32)
    rng = random.Random(seed)
    canary = f"KEV-CANARY-{secrets.token_hex(4).upper()}"
    canary_question = f"Remember the code word {canary}. Repeat it."
    extra = EXTRACTION_QUESTIONS if options.speculative else []
    questions = list(dict.fromkeys([*options.questions, *extra]))  # one reference per distinct question
    references = [*questions, canary_question]
    total, tick = len(references) + options.trials, on_progress or (lambda label, done, total: None)
    solo: dict[str, Result] = {}
    for q in references:
        tick(f"solo reference {len(solo) + 1}/{len(references)}", len(solo), total)
        solo[q] = run_mix(engine, [MixItem(q, options.max_tokens)], rng, options, drafts=False)[0]
    before = engine.load()
    checks = {q: QuestionCheck(q, len(solo[q].token_ids)) for q in questions}
    canary_check = QuestionCheck(canary_question, len(solo[canary_question].token_ids))
    leaks: list[str] = []
    for trial in range(options.trials):
        tick(f"packed mix {trial + 1}/{options.trials}", len(references) + trial, total)
        with_canary = trial == options.trials - 1
        items = make_mix(questions, rng, options, canary_question if with_canary else None)
        for item, result in zip(items, run_mix(engine, items, rng, options, drafts=options.speculative)):
            if item.text == canary_question:
                canary_check.record(result, solo[item.text])
            elif with_canary and canary[-8:].lower() in result.text.lower():
                leaks.append(f"{item.text[:40]!r} (channel {result.channel_id}): {result.text[:80]!r}")
            if not item.is_filler and item.text in checks:
                checks[item.text].record(result, solo[item.text])
    after = engine.load()
    return VerifyReport(options.level, engine.runner.fingerprint, seed, canary, options.trials,
                        list(checks.values()), canary_check, leaks, options.speculative,
                        after.spec_draft_tokens - before.spec_draft_tokens,
                        after.spec_accepted_tokens - before.spec_accepted_tokens)


def make_mix(questions: list[str], rng: random.Random, options: VerifyOptions, canary: str | None) -> list[MixItem]:
    items = [MixItem(q, options.max_tokens) for q in questions]
    if canary:
        items.append(MixItem(canary, options.max_tokens))
    for _ in range(rng.randint(0, options.max_fillers)):
        items.append(MixItem(rng.choice(FILLERS), rng.randint(1, options.max_tokens), is_filler=True))
    rng.shuffle(items)
    return items


def run_mix(engine: Engine, items: list[MixItem], rng: random.Random, options: VerifyOptions,
            drafts: bool = False) -> list[Result]:
    """Submit the items in two parts, a random number of steps apart; results in item order. drafts: with
    prompt-lookup drafts; else as the config says (plain where the mode is speculative: the reference)."""
    cut = rng.randint(1, len(items))
    queries = [{"text": item.text, "max_tokens": item.max_tokens} for item in items]
    # Prompt logprobs keep a question off the shared prefix, so only strict (which copies it anyway) asks for them.
    submit: dict[str, Any] = dict(isolation=options.level, system=options.system, timeout_ms=TIMEOUT_MS,
                                  logprobs=TOP_LOGPROBS, prompt_logprobs=options.level == "strict")
    if options.speculative:
        submit["speculative"] = DRAFTS_ON if drafts else DRAFTS_OFF
    first = engine.submit(queries[:cut], **submit)
    for _ in range(rng.randint(0, options.max_late_steps) if cut < len(items) else 0):
        engine.step()
    second = engine.submit(queries[cut:], **submit) if cut < len(items) else None
    results = sorted(engine.wait(first), key=lambda r: r.index)
    if second:
        results += sorted(engine.wait(second), key=lambda r: r.index)
    return results


def compare(result: Result, solo: Result) -> tuple[bool, float, str | None]:
    """(bit-identical?, max |delta logit| over the common steps, what differs)."""
    if result.status != "ok" or solo.status != "ok":
        return False, math.inf, f"status {result.status} / solo {solo.status}: {result.error or solo.error}"
    if result.logits is None or solo.logits is None:
        raise ValueError("verify needs results with logits (record_logits=True)")
    steps = min(len(result.logits), len(solo.logits))
    diff = (result.logits[:steps] - solo.logits[:steps]).abs().max().item() if steps else 0.0
    if result.token_ids != solo.token_ids:
        return False, diff, f"tokens differ in channel {result.channel_id}"
    if not torch.equal(result.logits, solo.logits):
        return False, diff, f"logits differ in channel {result.channel_id} (max |delta| {diff:.3g})"
    if result.logprobs != solo.logprobs:
        return False, diff, f"logprobs differ in channel {result.channel_id}"
    if result.prompt_logprobs != solo.prompt_logprobs:
        return False, diff, f"prompt logprobs differ in channel {result.channel_id}"
    return True, diff, None


def read_questions(path: str) -> list[str]:
    """One question per line; blank lines and lines starting with # are skipped."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
