"""Tally: a job's counts as it runs (done, failed, tokens, elapsed); the summary line and --json-summary."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kev.batch.records import is_failure, usage_of


@dataclass
class Tally:
    total: int  # requests of the job, those done in an earlier run included
    num_done: int = 0  # lines in the output (ok or failed)
    num_failed: int = 0
    num_resumed: int = 0  # of num_done, written by an earlier run
    prompt_tokens: int = 0
    completion_tokens: int = 0
    new_completion_tokens: int = 0  # this run's, for tokens/s
    interrupted: bool = False
    load_s: float = 0.0  # loading the model / connecting, before the first request
    started: float = field(default_factory=time.monotonic)

    def add(self, record: dict[str, Any]) -> None:
        prompt, completion = usage_of(record)
        self.num_done += 1
        self.num_failed += is_failure(record)
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.new_completion_tokens += completion

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens this run produced per second of wall time."""
        return self.new_completion_tokens / max(self.elapsed_s, 1e-9)

    @property
    def eta_s(self) -> float | None:
        new = self.num_done - self.num_resumed
        if new == 0:
            return None
        return self.elapsed_s / new * (self.total - self.num_done)

    def summary(self) -> dict[str, Any]:
        return {"requests": self.total, "done": self.num_done, "ok": self.num_done - self.num_failed,
                "failed": self.num_failed, "resumed": self.num_resumed, "remaining": self.total - self.num_done,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "wall_s": round(self.elapsed_s, 3), "load_s": round(self.load_s, 3),
                "completion_tokens_per_s": round(self.tokens_per_s, 2), "interrupted": self.interrupted}

    def summary_line(self) -> str:
        head = "interrupted" if self.interrupted else "done"
        return (f"{head}: {self.num_done}/{self.total} requests, {self.num_done - self.num_failed} ok, "
                f"{self.num_failed} failed ({self.num_resumed} from an earlier run); "
                f"{self.prompt_tokens} prompt + {self.completion_tokens} completion tokens; "
                f"{self.elapsed_s:.1f} s (+{self.load_s:.1f} s loading), {self.tokens_per_s:.1f} tok/s")
