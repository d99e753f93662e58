"""Following tasks to their end: WatchTask streams of at most 1000 task ids each (with each one's current status
first), or GetTask polling where a stream cannot be had (the intake refuses more streams, or has no WatchTask).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from sieve.cli import output
from sieve.cli.client import Client, CliError, ExitCode
from sieve.cli.progress import progress_bar
from sieve.v1 import intake_pb2, types_pb2

FINAL = frozenset(
    {
        types_pb2.TASK_STATUS_SUCCEEDED,
        types_pb2.TASK_STATUS_FAILED,
        types_pb2.TASK_STATUS_EXPIRED,
        types_pb2.TASK_STATUS_CANCELLED,
        types_pb2.TASK_STATUS_DEAD_LETTERED,
    }
)
#: WatchTask takes at most this many task ids
WATCH_IDS = 1000
#: streams open at once (the intake allows a caller 16 by default)
STREAMS = 4
POLL_INTERVAL_S = 0.25


class Followed(Protocol):
    """What a followed item keeps: its task, and once final its status, verdict and the change's detail."""

    task_id: str
    status: str
    verdict: str
    detail: str


class Tracker:
    """The final changes seen so far, by task id; tells each item of a task when it ends."""

    def __init__(self, items: Sequence[Followed], advance: Callable[[int], None]) -> None:
        self.by_task: dict[str, list[Followed]] = {}
        for item in items:
            if item.task_id:
                self.by_task.setdefault(item.task_id, []).append(item)
        self.open = set(self.by_task)
        self.advance = advance

    def final(self, task_id: str, status: int, verdict: int, detail: str) -> None:
        if task_id not in self.open:
            return
        self.open.discard(task_id)
        for item in self.by_task[task_id]:
            item.status, item.verdict, item.detail = output.status(status), output.verdict(verdict), detail
        self.advance(len(self.by_task[task_id]))


async def _watch(client: Client, tracker: Tracker, ids: list[str]) -> None:
    """One stream over `ids` until each of them is final."""
    call = client.intake().WatchTask(
        intake_pb2.WatchTaskRequest(task_ids=ids, initial_state=True), **client.options(timeout=False)
    )
    wanted = set(ids)
    try:
        async for reply in client.stream("intake", call):
            for change in reply.changes:
                if change.status in FINAL:
                    tracker.final(change.task_id, change.status, change.verdict, change.detail)
            if not wanted & tracker.open:
                return
    finally:
        call.cancel()


async def _poll(client: Client, tracker: Tracker, ids: list[str]) -> None:
    """GetTask each of `ids` until it is final."""
    pending = [i for i in ids if i in tracker.open]
    while pending:
        for task_id in pending:
            reply = await client.call(
                "intake", client.intake().GetTask(intake_pb2.GetTaskRequest(task_id=task_id), **client.options())
            )
            task = reply.task
            if task.status in FINAL:
                tracker.final(task_id, task.status, task.result.verdict, task.error)
        pending = [i for i in pending if i in tracker.open]
        if pending:
            await asyncio.sleep(POLL_INTERVAL_S)


async def _follow_chunk(client: Client, tracker: Tracker, ids: list[str], gate: asyncio.Semaphore) -> None:
    async with gate:
        try:
            await _watch(client, tracker, ids)
        except CliError as exc:
            # a stream refused (too many open) or not offered: poll instead; a bad token or a lost intake ends all
            if exc.code in (ExitCode.AUTH, ExitCode.UNAVAILABLE):
                raise
            await _poll(client, tracker, ids)
            return
        if tracker.open & set(ids):  # the stream ended with tasks open (it should not): ask for each
            await _poll(client, tracker, ids)


async def follow(client: Client, items: Sequence[Followed], *, timeout_s: float, show: bool) -> None:
    """Waits until every item's task is final or `timeout_s` passed (then those still open keep no status)."""
    with progress_bar("waiting", sum(1 for i in items if i.task_id), show) as advance:
        tracker = Tracker(items, advance)
        ids = sorted(tracker.open)
        gate = asyncio.Semaphore(STREAMS)
        chunks = [ids[i : i + WATCH_IDS] for i in range(0, len(ids), WATCH_IDS)]
        started = time.monotonic()
        try:
            await asyncio.wait_for(
                asyncio.gather(*(_follow_chunk(client, tracker, chunk, gate) for chunk in chunks)), timeout_s
            )
        except TimeoutError:
            output.err_console().print(
                f"sieve: {len(tracker.open)} tasks not final after {output.seconds(time.monotonic() - started)}"
            )


__all__ = ["FINAL", "Followed", "Tracker", "follow"]
