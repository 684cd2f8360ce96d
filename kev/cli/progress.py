"""Progress on stderr for commands that run longer than a couple of seconds (run, bench, verify, stress).

The library reports progress as on_progress(label, done, total) (questions, runs or seconds). On a terminal a rich
bar, transient, so the command's table or JSON is all that stays; elsewhere (a CI log, a file) a plain line every
few seconds or 10% (kev/cli/progress_lines.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console

from kev.cli.progress_lines import ProgressLines
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

OnProgress = Callable[[str, float, float], None]


@contextmanager
def progress_bar(first_label: str) -> Iterator[OnProgress]:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TimeElapsedColumn())
    console = Console(stderr=True)
    if not console.is_terminal:
        lines = ProgressLines(first_label)
        last: list[tuple[str, float, float]] = []

        def write(label: str, done: float, total: float) -> None:
            lines.update(done, total, label=label)
            last[:] = [(label, done, total)]

        yield write
        if last:
            label, done, total = last[0]
            lines.close(done, total, label=label)
        return
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(first_label, total=None)

        def report(label: str, done: float, total: float) -> None:
            progress.update(task, description=label, completed=done, total=total)

        yield report
