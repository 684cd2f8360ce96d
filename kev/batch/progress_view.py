"""Progress on stderr while a job runs (rich): done / total, failed, tokens/s, ETA."""
from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kev.batch.tally import Tally


class ProgressView:
    """A no-op when quiet; otherwise a live bar that update() refreshes from the tally."""

    def __init__(self, tally: Tally, quiet: bool, label: str = "kev batch") -> None:
        self.tally = tally
        self.console = Console(stderr=True)
        self._progress = None if quiet else Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"), TextColumn("{task.fields[rate]} tok/s"),
            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"), console=self.console, refresh_per_second=4)
        self._task = None if self._progress is None else self._progress.add_task(
            label, total=tally.total, completed=tally.num_done, failed=tally.num_failed, rate="-", eta="-")

    def update(self) -> None:
        if self._progress is None or self._task is None:
            return
        t = self.tally
        eta = t.eta_s
        self._progress.update(self._task, completed=t.num_done, failed=t.num_failed, rate=f"{t.tokens_per_s:.1f}",
                              eta="-" if eta is None else _clock(eta))

    def __enter__(self) -> ProgressView:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self.update()
            self._progress.stop()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
