"""What a drafted row costs on this machine, measured: the draft policy's evidence (speculative.policy: measured).

A question's draft of K tokens is K extra rows of the step. They pay when the tokens they are expected to keep are
worth more than the time they add: with T(m) the measured time of a decode step of m rows and a the measured share
of drafted tokens kept, K rows beside r plain rows pay while T(r + K) / T(r) <= 1 + E(K) / r, where
E(K) = a + a^2 + ... + a^K is what a draft of K keeps on average (a draft is kept up to its first miss). How T grows
with m is the machine's and the precision's (bench/results/speculative.md: on the AMX Xeon in bf16 a step of 8 rows
took 1.56x a step of 1; the AVX2 GGUF kernel is compute-bound from 2 rows), and the load changes it, so it is
measured from the engine's own steps rather than fixed.

Times are exponential moving averages per row count, taken from decode-only steps (a prompt chunk's rows cost what
their attention costs). A row count never measured counts as paying, so the first step that tries it measures it; so
does one not measured for REMEASURE_AFTER steps, or a verdict taken on a busy machine (or before the caches were warm)
would stand for good: a question alone never takes those rows again unless it drafts them.
Answers never depend on any of this: drafts change how many positions a step computes, never a token or a logit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SMOOTHING = 0.2  # weight of the newest measurement in each moving average
PRIOR_ACCEPTANCE = 0.5  # the share of drafted tokens taken as kept before any draft was verified
# Decode steps after which a row count's time is measured again (one step's extra rows in every REMEASURE_AFTER: at
# most a fraction of a percent of the time, where a draft turns out not to pay after all).
REMEASURE_AFTER = 256


@dataclass
class DraftCosts:
    step_seconds: dict[int, float] = field(default_factory=dict)  # decode-only step time by row count
    acceptance: float = PRIOR_ACCEPTANCE  # moving share of drafted tokens kept
    steps: int = 0  # decode-only steps recorded
    measured_at: dict[int, int] = field(default_factory=dict)  # row count -> `steps` when last measured

    def record_step(self, rows: int, seconds: float) -> None:
        old = self.step_seconds.get(rows)
        # A stale average is replaced, not moved: one fresh step says more than what the machine did long ago.
        if old is None or self._stale(rows):
            self.step_seconds[rows] = seconds
        else:
            self.step_seconds[rows] = old + SMOOTHING * (seconds - old)
        self.steps += 1
        self.measured_at[rows] = self.steps

    def record_verify(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.acceptance += SMOOTHING * (accepted / drafted - self.acceptance)

    def affordable(self, rows: int, most: int) -> int:
        """How many draft rows (at most `most`) a step of `rows` plain rows may add and still pay."""
        base = self.step_seconds.get(rows)
        if base is None or rows <= 0:
            return most  # not measured yet: this step measures it
        best = 0
        for extra in range(1, most + 1):
            seconds = self.step_seconds.get(rows + extra)
            if seconds is None or self._stale(rows + extra):
                return extra  # the first row count not measured (lately): try it
            if seconds <= base * (1 + self.kept(extra) / rows):
                best = extra
        return best

    def _stale(self, rows: int) -> bool:
        return self.steps - self.measured_at[rows] >= REMEASURE_AFTER

    def kept(self, drafted: int) -> float:
        """E(K): the tokens a draft of K is expected to keep (kept up to its first miss)."""
        a = min(self.acceptance, 0.999)
        return a * (1 - a**drafted) / (1 - a)
