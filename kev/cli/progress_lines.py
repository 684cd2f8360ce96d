"""Progress as plain lines, for stderr that is not a terminal (a CI log, a file): what pip and tqdm do there.

A live bar redraws in place, which a log cannot show (rich prints nothing until the end); so a line is written at
the first update, then whenever `interval_s` has passed or another `step_percent` of the work is done, and once at
the end. Every line stands alone: label, done/total and percent, the caller's detail, elapsed time.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

INTERVAL_S = 5.0
STEP_PERCENT = 10.0


class ProgressLines:
    def __init__(self, label: str, stream: TextIO | None = None, interval_s: float = INTERVAL_S,
                 step_percent: float = STEP_PERCENT) -> None:
        self.label, self.stream = label, stream or sys.stderr
        self.interval_s, self.step_percent = interval_s, step_percent
        self._started = time.monotonic()
        self._last_at: float | None = None
        self._last_percent = 0.0
        self._last_count = ""

    def update(self, done: float, total: float | None, detail: str = "", label: str | None = None) -> None:
        now = time.monotonic()
        percent = 100.0 * done / total if total else None
        due = self._last_at is None or now - self._last_at >= self.interval_s or (
            percent is not None and percent >= self._last_percent + self.step_percent)
        if due:
            self._write(now, done, total, percent, detail, label)

    def close(self, done: float, total: float | None, detail: str = "", label: str | None = None) -> None:
        """The last line (unless the last update already reached the same count: its rates are news enough)."""
        now = time.monotonic()
        self._write(now, done, total, 100.0 * done / total if total else None, detail, label, final=True)

    def _write(self, now: float, done: float, total: float | None, percent: float | None, detail: str,
               label: str | None, final: bool = False) -> None:
        count = f"{done:g}/{total:g} ({percent:.0f}%)" if total and percent is not None else f"{done:g}"
        body = f"{label or self.label}: {count}" + (f", {detail}" if detail else "")
        if final and count == self._last_count:
            return
        self.stream.write(f"{body}, elapsed {clock(now - self._started)}\n")
        self.stream.flush()
        self._last_at, self._last_count = now, count
        if percent is not None:
            self._last_percent = percent - percent % self.step_percent  # the step it reached: 37% -> 30%


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
