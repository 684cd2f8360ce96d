"""A rich progress bar on stderr for commands that run longer than a couple of seconds (bench, verify, stress).

The library reports progress as on_progress(label, done, total) (questions, runs or seconds); the bar is
transient, so the command's table or JSON is all that stays.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

OnProgress = Callable[[str, float, float], None]


@contextmanager
def progress_bar(first_label: str) -> Iterator[OnProgress]:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TimeElapsedColumn())
    console = Console(stderr=True)
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(first_label, total=None)

        def report(label: str, done: float, total: float) -> None:
            progress.update(task, description=label, completed=done, total=total)

        yield report
