"""Group commit: many concurrent callers' rows written together, one statement and one commit per group.

A writer loop takes everything waiting, writes it, and meanwhile lets the next group gather: an idle
worker writes at once (no timer), a busy one writes large groups. When PostgreSQL is unreachable the
rows are kept and retried with jittered backoff, within a bound; callers then get GroupWriteError and
must not ack what was not written.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from sieve.backoff import Backoff

log = logging.getLogger("sieve.worker.group_commit")

T = TypeVar("T")
R = TypeVar("R")

#: give up on a group after this many failed writes (the caller nacks it; another try comes later)
MAX_WRITE_ATTEMPTS = 12


class GroupWriteError(Exception):
    """Rows could not be written within the retry bound."""


class GroupCommit(Generic[T, R]):
    """Runs `write(items) -> results` (same order) for items submitted by many callers at once.

    Owns the waiting calls (each call's items and one future for all of them) and the writer loop (`run`) that
    takes whole calls, up to `max_items` items at a time (a call larger than that is written in pieces of
    `max_items`); a group that cannot be written within `max_attempts` fails its callers with GroupWriteError."""

    def __init__(
        self,
        name: str,
        write: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        max_items: int = 500,
        max_attempts: int = MAX_WRITE_ATTEMPTS,
    ) -> None:
        self.name = name
        self._write = write
        self.max_items = max(1, max_items)
        self.max_attempts = max_attempts
        self._waiting: deque[tuple[Sequence[T], asyncio.Future[list[R]]]] = deque()
        self._ready = asyncio.Event()
        self.groups = 0
        self.rows = 0

    async def submit(self, items: Sequence[T]) -> list[R]:
        """Writes `items` with whatever else is waiting; returns their results in order."""
        if not items:
            return []
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._waiting.append((items, future))
        self._ready.set()
        return await future

    def _take(self) -> list[tuple[Sequence[T], asyncio.Future[list[R]]]]:
        """The next group: whole calls, in order, up to max_items items (at least one call)."""
        group = [self._waiting.popleft()]
        size = len(group[0][0])
        while self._waiting and size + len(self._waiting[0][0]) <= self.max_items:
            call = self._waiting.popleft()
            group.append(call)
            size += len(call[0])
        return group

    async def run(self) -> None:
        """The writer loop (one per process)."""
        while True:
            await self._ready.wait()
            group = self._take() if self._waiting else []
            if not self._waiting:
                self._ready.clear()
            if group:
                await self._flush(group)

    async def _flush(self, group: list[tuple[Sequence[T], asyncio.Future[list[R]]]]) -> None:
        items = [item for call, _ in group for item in call]
        results: list[R] = []
        for i in range(0, len(items), self.max_items):  # one piece, unless a single call is larger
            piece = await self._write_piece(items[i : i + self.max_items], group)
            if piece is None:
                return
            results.extend(piece)
        self.groups += 1
        self.rows += len(items)
        at = 0
        for call, future in group:
            if not future.done():
                future.set_result(results[at : at + len(call)])
            at += len(call)

    async def _write_piece(
        self, items: list[T], group: list[tuple[Sequence[T], asyncio.Future[list[R]]]]
    ) -> Sequence[R] | None:
        """Writes `items`, retrying with backoff; None (the group's callers failed) when it gives up."""
        backoff = Backoff(base_s=0.1, max_s=5.0)
        while True:
            try:
                results = await self._write(items)
                if len(results) != len(items):
                    raise RuntimeError(f"{self.name}: {len(results)} results for {len(items)} rows")
                return results
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if backoff.failures + 1 >= self.max_attempts:
                    log.error(
                        "%s: giving up on %d rows after %d tries: %s", self.name, len(items), self.max_attempts, exc
                    )
                    for _, future in group:
                        if not future.done():
                            future.set_exception(GroupWriteError(str(exc)))
                    return None
                delay = backoff.next()
                log.warning("%s: write failed (%s); retry %d in %.2fs", self.name, exc, backoff.failures, delay)
                await asyncio.sleep(delay)
