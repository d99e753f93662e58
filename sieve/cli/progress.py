"""The progress bar of long commands (on stderr): done of total, items per second and the time left."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from sieve.cli.output import err_console


class RateColumn(ProgressColumn):
    """Items per second since the bar started."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        if not elapsed or not task.completed:
            return Text("-/s", style="progress.data.speed")
        return Text(f"{task.completed / elapsed:,.1f}/s", style="progress.data.speed")


@contextmanager
def progress_bar(description: str, total: int, show: bool) -> Iterator[Callable[[int], None]]:
    """A bar of `total` items while the block runs; the block advances it by calling what it is given. Nothing is
    drawn when `show` is false (the callable still works)."""
    if not show:
        yield lambda _count: None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err_console(),
        transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda count: progress.advance(task, count)


__all__ = ["RateColumn", "progress_bar"]
