"""Progress on stderr while a job runs: done / total, failed, tokens/s, ETA.

A live rich bar on a terminal; on anything else (a CI log, a file) plain lines every few seconds or 10%
(kev/cli/progress_lines.py), since a bar that redraws in place shows nothing in a log until the end."""
from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kev.batch.tally import Tally
from kev.cli.progress_lines import ProgressLines, clock


class ProgressView:
    """A no-op when quiet; otherwise a live bar (terminal) or progress lines that update() refreshes from the
    tally."""

    def __init__(self, tally: Tally, quiet: bool, label: str = "kev batch") -> None:
        self.tally = tally
        self.console = Console(stderr=True)
        is_bar = not quiet and self.console.is_terminal
        self._lines = ProgressLines(label) if not quiet and not is_bar else None
        self._progress = None if not is_bar else Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"), TextColumn("{task.fields[rate]} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"), console=self.console, refresh_per_second=4)
        self._task = None if self._progress is None else self._progress.add_task(
            label, total=tally.total, completed=tally.num_done, failed=tally.num_failed, rate="-", eta="-")

    def update(self) -> None:
        t = self.tally
        eta = self._eta()
        if self._lines is not None:
            self._lines.update(t.num_done, t.total, self._detail(eta))
        if self._progress is None or self._task is None:
            return
        self._progress.update(self._task, completed=t.num_done, failed=t.num_failed, rate=f"{t.tokens_per_s:.1f}",
                              eta=eta)

    def _eta(self) -> str:
        return "-" if self.tally.eta_s is None else clock(self.tally.eta_s)

    def _detail(self, eta: str) -> str:
        return f"{self.tally.num_failed} failed, {self.tally.tokens_per_s:.1f} tok/s, ETA {eta}"

    def __enter__(self) -> ProgressView:
        if self._progress is not None:
            self._progress.start()
        self.update()  # a log sees the job start (lines from an earlier run counted) before the model loads
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._lines is not None:
            self._lines.close(self.tally.num_done, self.tally.total, self._detail(self._eta()))
        if self._progress is not None:
            self.update()
            self._progress.stop()
