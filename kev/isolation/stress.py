"""Stress: a varied-length soak in overlapping waves, under each isolation level the config can run.

Per level: submit waves of random questions (random max_tokens, some prompts a few tokens short of
max_context) for half the level's time, drain until 70%, cancel what is left, then re-run the
distinct answered questions alone (greedy) until the level's time is up: every answer must be a
prefix of its solo answer (equal when it stopped by itself). Alerts come from the audit log.
"""
from __future__ import annotations

import random
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kev.results.result import Result
from kev.config import KevConfig, load_config
from kev.engine.engine import Engine
from kev.errors import ConfigError, OverflowTimeoutError, RejectedError
from kev.isolation.alert_log import EXPECTED_IN_SOAK, audit_target, log_size, read_alerts
from kev.isolation.levels import accepted_levels, config_for_level
from kev.isolation.stress_questions import StressQuestion, make_questions
from kev.isolation.verify import DEFAULT_SYSTEM

EngineFactory = Callable[[KevConfig], Engine]
Key = tuple[str, str | None]  # (question text, system prompt)


@dataclass(frozen=True)
class StressOptions:
    duration_s: float = 60.0
    num_questions: int = 48
    max_tokens: int = 12  # each question of a wave draws max_tokens in [2, max_tokens]
    levels: tuple[str, ...] | None = None  # None: every level the config can run
    seed: int | None = None
    system: str = DEFAULT_SYSTEM
    on_progress: Callable[[str], None] | None = None  # told what runs now, between waves (the CLI's time bar)


@dataclass
class LevelReport:
    level: str
    questions: int = 0  # distinct questions generated
    waves: int = 0
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    timed_out: int = 0
    cancelled: int = 0
    truncated: int = 0  # answers cut by max_context
    alerts: dict[str, int] | None = None  # None: not collected (no audit log in this Kev)
    audit_records: int = 0
    solo_distinct: int = 0  # distinct questions with a completed answer
    solo_checked: int = 0
    solo_matched: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def isolation_alerts(self) -> int:
        return sum(n for kind, n in (self.alerts or {}).items() if kind not in EXPECTED_IN_SOAK)

    @property
    def all_match(self) -> bool:
        return self.solo_matched == self.solo_checked

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.all_match and self.isolation_alerts == 0


@dataclass
class StressReport:
    seed: int
    duration_s: float
    levels: list[LevelReport]

    @property
    def ok(self) -> bool:
        return all(level.ok for level in self.levels)

    def to_dict(self) -> dict[str, Any]:
        levels = {r.level: {**vars(r), "all_match": r.all_match, "ok": r.ok} for r in self.levels}
        return {"seed": self.seed, "duration_s": round(self.duration_s, 1), "levels": levels, "ok": self.ok}


def run_stress(factory: EngineFactory, base: KevConfig, options: StressOptions) -> StressReport:
    started = time.monotonic()
    seed = options.seed if options.seed is not None else secrets.randbits(32)
    rng = random.Random(seed)
    levels = list(options.levels or accepted_levels(base, options.system))
    reports = []
    with tempfile.TemporaryDirectory(prefix="kev-stress-") as tmp:
        for i, level in enumerate(levels):
            budget_s = max(0.0, started + options.duration_s - time.monotonic()) / (len(levels) - i)
            reports.append(stress_level(factory, base, level, options, rng, budget_s, Path(tmp)))
    return StressReport(seed, time.monotonic() - started, reports)


def stress_level(factory: EngineFactory, base: KevConfig, level: str, options: StressOptions, rng: random.Random,
                 budget_s: float, tmp: Path) -> LevelReport:
    """budget_s: the level's time, counted once its engine is up (building one on a loaded machine can take
    longer than a short soak's whole share, which left no time for a single wave)."""
    config = config_for_level(base, level, options.system)
    overrides, audit_path = audit_target(config, tmp, level)
    try:
        config = load_config(config, overrides) if overrides else config
    except ConfigError:
        audit_path = None
    offset = log_size(audit_path)
    report = LevelReport(level)
    # strict: half the questions carry a system prompt (copied per channel); shared/loose: all share it.
    declared = config.isolation.system_prompt if level == "loose" else None
    systems: list[str | None] = [None, options.system] if level == "strict" else [declared or options.system]
    with factory(config) as engine:
        until = time.monotonic() + budget_s
        questions = make_questions(engine.tokenizer, options.num_questions, config.core.max_context, rng, systems)
        report.questions = len(questions)
        soak = Soak(engine, level, declared, options, rng, report)
        answers = soak.run(questions, until)
        check_solo(soak, answers, until)
    if audit_path is not None:
        alerts, report.audit_records = read_alerts(audit_path, offset)
        report.alerts = dict(alerts)
    return report


@dataclass
class Answer:
    token_ids: list[int]
    finish_reason: str | None
    max_tokens: int


class Soak:
    """Submits waves and tallies their results into the level report."""

    def __init__(self, engine: Engine, level: str, declared: str | None, options: StressOptions,
                 rng: random.Random, report: LevelReport) -> None:
        self.engine, self.level, self.declared, self.options, self.rng, self.report = (
            engine, level, declared, options, rng, report)
        self.answers: dict[Key, list[Answer]] = {}

    def submit_system(self, system: str | None) -> str | None:
        # loose: the config's declared prompt applies by itself (that is what makes it public)
        return None if system is not None and system == self.declared else system

    def run(self, questions: list[StressQuestion], until: float) -> dict[Key, list[Answer]]:
        now = time.monotonic()
        soak_end, drain_end = now + 0.5 * (until - now), now + 0.7 * (until - now)
        outstanding: list[tuple[str, list[tuple[StressQuestion, int]]]] = []
        while time.monotonic() < soak_end:
            outstanding = self.collect(outstanding)
            if len(outstanding) < 2:
                outstanding += self.wave(questions, drain_end)
            if self.options.on_progress is not None:
                self.options.on_progress(f"{self.level}: {self.report.waves} waves, {self.report.completed} answered")
            time.sleep(self.rng.uniform(0.05, 0.3))
        while outstanding and time.monotonic() < drain_end:
            outstanding = self.collect(outstanding)
            time.sleep(0.05)
        for request_id, _ in outstanding:
            self.engine.cancel(request_id)
        self.collect(outstanding)
        return self.answers

    def wave(self, questions: list[StressQuestion],
             drain_end: float) -> list[tuple[str, list[tuple[StressQuestion, int]]]]:
        size = self.rng.randint(1, min(len(questions), max(1, 3 * self.engine.config.router.max_parallel_queries // 2)))
        picked = [(q, self.rng.randint(2, max(2, self.options.max_tokens))) for q in self.rng.sample(questions, size)]
        timeout_ms = max(1000, int((drain_end - time.monotonic()) * 1000))
        submitted = []
        for system in dict.fromkeys(q.system for q, _ in picked):  # one submit per system prompt
            group = [(q, m) for q, m in picked if q.system == system]
            try:
                request_id = self.engine.submit([{"text": q.text, "max_tokens": m} for q, m in group],
                                                isolation=self.level, system=self.submit_system(system),
                                                timeout_ms=timeout_ms)
            # the pool stayed full till the drain: nothing was left behind
            except (RejectedError, OverflowTimeoutError):
                continue
            submitted.append((request_id, group))
            self.report.submitted += len(group)
        self.report.waves += 1
        return submitted

    def collect(self, outstanding: list[tuple[str, list[tuple[StressQuestion, int]]]]) -> list[tuple[str, Any]]:
        """Tally the finished requests; returns those still running."""
        left = []
        for request_id, group in outstanding:
            results = self.engine.results(request_id)
            if len(results) < len(group):
                left.append((request_id, group))
                continue
            for result in results:
                question, max_tokens = group[result.index]
                self.tally(question, max_tokens, result)
        return left

    def tally(self, question: StressQuestion, max_tokens: int, result: Result) -> None:
        r = self.report
        if result.status == "ok":
            r.completed += 1
            r.truncated += result.tokens >= self.engine.config.core.max_context
            key = (question.text, question.system)
            self.answers.setdefault(key, []).append(Answer(result.token_ids, result.finish_reason, max_tokens))
        elif result.status == "timeout":
            r.timed_out += 1
        elif result.status == "cancelled":
            r.cancelled += 1
        else:
            r.failed += 1
            if len(r.problems) < 5:
                r.problems.append(f"{result.status}: {result.error}")


def check_solo(soak: Soak, answers: dict[Key, list[Answer]], until: float) -> None:
    """Re-run distinct answered questions alone (greedy), a random sample as time allows."""
    report, engine = soak.report, soak.engine
    keys = list(answers)
    soak.rng.shuffle(keys)
    report.solo_distinct = len(keys)
    for text, system in keys:
        remaining = until - time.monotonic()
        if remaining <= 0:
            break
        runs = answers[(text, system)]
        if soak.options.on_progress is not None:
            soak.options.on_progress(f"{soak.level}: solo re-run {report.solo_checked + 1}/{len(keys)}")
        request_id = engine.submit([text], isolation=soak.level, system=soak.submit_system(system),
                                   max_tokens=max(a.max_tokens for a in runs), timeout_ms=600_000)
        try:
            solo = engine.wait(request_id, timeout=remaining)[0]
        except TimeoutError:
            engine.cancel(request_id)
            break
        report.solo_checked += 1
        same = all(solo.token_ids[:len(a.token_ids)] == a.token_ids
                   and (a.finish_reason != "stop" or len(a.token_ids) == len(solo.token_ids)) for a in runs)
        report.solo_matched += same and solo.status == "ok"
        if not same and len(report.problems) < 5:
            report.problems.append(f"differs from solo: {text[:40]!r}")

