"""What the scheduler records in PostgreSQL: expiries, dead letters, routing decisions, and (through
`lifecycle`) hand-outs and put-backs.

These are off the hot path (a task's normal path is recorded by the worker). A failed write is logged
and does not stop dispatching: the queue state in Redis is already consistent.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from scheduler_svc.lifecycle import LifecycleWriter
from sieve.db.tasks import TaskStore
from sieve.redis.entry import Entry

log = logging.getLogger("sieve.scheduler.outcomes")


class Outcomes:
    """Records what became of tasks the scheduler gave up on or routed specially (EXPIRED, DEAD_LETTERED, notes in
    a task's history) and counts them; owns the `LifecycleWriter` of hand-outs and put-backs."""

    def __init__(self, tasks: TaskStore) -> None:
        self.tasks = tasks
        self.expired_count = 0
        self.dead_letter_count = 0
        #: ASSIGNED and put-back records (scheduler_svc/lifecycle.py)
        self.lifecycle = LifecycleWriter(tasks)

    async def expired(self, entries: list[Entry]) -> None:
        self.expired_count += len(entries)
        await self._transition(
            [e.task_id for e in entries], "EXPIRED", "TTL passed before it was handed out", error="expired"
        )

    async def dead_lettered(self, records: list[dict[str, Any]]) -> None:
        self.dead_letter_count += len(records)
        for record in records:
            await self._transition([record["task_id"]], "DEAD_LETTERED", record["error"], error=record["error"])

    async def noted(self, task_ids: list[str], detail: str) -> None:
        if not task_ids:
            return
        try:
            await self.tasks.note([uuid.UUID(t) for t in task_ids], detail)
        except Exception:
            log.exception("could not note %r on %d tasks", detail, len(task_ids))

    async def _transition(self, task_ids: list[str], status: str, detail: str, *, error: str) -> None:
        if not task_ids:
            return
        try:
            await self.tasks.transition([uuid.UUID(t) for t in task_ids], status, detail, error=error)
        except Exception:
            log.exception("could not record %s for %d tasks", status, len(task_ids))
