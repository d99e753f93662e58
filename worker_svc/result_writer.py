"""Group commit of results: outcomes from many concurrent batches are written in one transaction.

A batch waits at most result_flush_ms for company (or until result_flush_rows are waiting). When
PostgreSQL is unreachable the rows are kept and retried with backoff, within a bound; the caller acks
only what was stored, so nothing is acked without its result.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from sieve.backoff import Backoff
from sieve.db.tasks import Outcome, TaskStore
from sieve.settings import Settings

log = logging.getLogger("sieve.worker.results")

#: give up on a group after this many failed writes (the caller nacks it; another try comes later)
MAX_WRITE_ATTEMPTS = 12


class ResultWriteError(Exception):
    """Results could not be written within the retry bound."""


class ResultWriter:
    def __init__(self, tasks: TaskStore, settings: Settings) -> None:
        self.tasks = tasks
        self.max_rows = settings.result_flush_rows
        self.flush_s = settings.result_flush_ms / 1000
        self._waiting: list[tuple[Outcome, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        self.refused = 0
        self.groups = 0

    async def store(self, outcomes: list[Outcome]) -> dict[uuid.UUID, bool]:
        """Writes outcomes (with others'); returns per task whether it was stored (False: refused by
        fencing). Raises ResultWriteError when PostgreSQL stayed unreachable."""
        loop = asyncio.get_running_loop()
        futures = []
        for outcome in outcomes:
            future: asyncio.Future[bool] = loop.create_future()
            self._waiting.append((outcome, future))
            futures.append(future)
        if len(self._waiting) >= self.max_rows:
            self._wake.set()
        results = await asyncio.gather(*futures)
        return {o.task_id: r for o, r in zip(outcomes, results, strict=True)}

    async def run(self) -> None:
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wait_for_rows()
            if len(self._waiting) < self.max_rows:
                await asyncio.sleep(self.flush_s)
            group, self._waiting = self._waiting[: self.max_rows], self._waiting[self.max_rows :]
            await self._write(group)

    async def _wait_for_rows(self) -> None:
        while not self._waiting:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.flush_s)
            except TimeoutError:
                continue
            self._wake.clear()

    async def _write(self, group: list[tuple[Outcome, asyncio.Future[bool]]]) -> None:
        backoff = Backoff(base_s=0.1, max_s=5.0)
        while True:
            try:
                stored = await self.tasks.finish([o for o, _ in group])
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if backoff.failures + 1 >= MAX_WRITE_ATTEMPTS:
                    log.error("giving up on %d results after %d tries: %s", len(group), MAX_WRITE_ATTEMPTS, exc)
                    for _, future in group:
                        if not future.done():
                            future.set_exception(ResultWriteError(str(exc)))
                    return
                delay = backoff.next()
                log.warning("result write failed (%s); retry %d in %.2fs", exc, backoff.failures, delay)
                await asyncio.sleep(delay)
        self.groups += 1
        for outcome, future in group:
            ok = outcome.task_id in stored
            if not ok:
                self.refused += 1
            if not future.done():
                future.set_result(ok)
