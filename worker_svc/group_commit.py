"""Group commit: many concurrent callers' rows written together, one statement and one commit per group.

A writer loop takes everything waiting, writes it, and meanwhile lets the next group gather: an idle
worker writes at once (no timer), a busy one writes large groups. When PostgreSQL is unreachable the
rows are kept and retried with jittered backoff, within a bound; callers then get GroupWriteError and
must not ack what was not written.
"""

from __future__ import annotations

import asyncio
import logging
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

    Owns the waiting items and their futures, and the writer loop (`run`) that takes up to `max_items` at a
    time; a group that cannot be written within `max_attempts` fails its callers with GroupWriteError."""

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
        self.max_items = max_items
        self.max_attempts = max_attempts
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._ready = asyncio.Event()
        self.groups = 0
        self.rows = 0

    async def submit(self, items: Sequence[T]) -> list[R]:
        """Writes `items` with whatever else is waiting; returns their results in order."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = []
        for item in items:
            future: asyncio.Future[R] = loop.create_future()
            self._waiting.append((item, future))
            futures.append(future)
        self._ready.set()
        return list(await asyncio.gather(*futures))

    async def run(self) -> None:
        """The writer loop (one per process)."""
        while True:
            await self._ready.wait()
            group, self._waiting = self._waiting[: self.max_items], self._waiting[self.max_items :]
            if not self._waiting:
                self._ready.clear()
            if group:
                await self._flush(group)

    async def _flush(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        backoff = Backoff(base_s=0.1, max_s=5.0)
        items = [item for item, _ in group]
        while True:
            try:
                results = await self._write(items)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if backoff.failures + 1 >= self.max_attempts:
                    log.error(
                        "%s: giving up on %d rows after %d tries: %s", self.name, len(group), self.max_attempts, exc
                    )
                    for _, future in group:
                        if not future.done():
                            future.set_exception(GroupWriteError(str(exc)))
                    return
                delay = backoff.next()
                log.warning("%s: write failed (%s); retry %d in %.2fs", self.name, exc, backoff.failures, delay)
                await asyncio.sleep(delay)
        self.groups += 1
        self.rows += len(group)
        for (_, future), result in zip(group, results, strict=True):
            if not future.done():
                future.set_result(result)
