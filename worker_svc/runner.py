"""Running one assignment batch: mark RUNNING and read payloads, detect, store results, say what to ack.

Both database steps go through group commits shared by every batch in flight, so a busy worker makes
one round trip and one commit for many batches. A task the database does not hand back (already
finished, cancelled, or owned by a newer attempt) is acked without running: the ack clears this
worker's lease if it is still the current one and is refused otherwise.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sieve.db.tasks import Outcome, Started, TaskStore
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2
from worker_svc.detection import detect_text, failed
from worker_svc.group_commit import GroupCommit, GroupWriteError
from worker_svc.lexicon import Lexicon

log = logging.getLogger("sieve.worker.runner")

Attempt = tuple[uuid.UUID, int, datetime]


class BatchRunner:
    def __init__(self, tasks: TaskStore, lexicon: Lexicon, worker_id: str, settings: Settings) -> None:
        self.tasks = tasks
        self.lexicon = lexicon
        self.worker_id = worker_id
        self.starts: GroupCommit[Attempt, Started | None] = GroupCommit(
            "start", self._start, max_items=settings.result_flush_rows)
        self.results: GroupCommit[Outcome, bool] = GroupCommit(
            "results", self._finish, max_items=settings.result_flush_rows)
        self.skipped = 0
        self.refused = 0

    async def _start(self, attempts: Sequence[Attempt]) -> list[Started | None]:
        started = {s.task_id: s for s in await self.tasks.start(self.worker_id, attempts)}
        return [started.get(task_id) for task_id, _, _ in attempts]

    async def _finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        stored = await self.tasks.finish(outcomes)
        return [o.task_id in stored for o in outcomes]

    async def __call__(self, assignments: list[scheduler_pb2.Assignment]
                       ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        attempts = [(uuid.UUID(a.task_id), a.attempt, a.assigned_at.ToDatetime(UTC)) for a in assignments]
        try:
            started = [s for s in await self.starts.submit(attempts) if s is not None]
        except GroupWriteError as exc:  # PostgreSQL away: give the batch back, uncounted
            return [], [self._nack(a, f"database unavailable: {exc}") for a in assignments]
        self.skipped += len(assignments) - len(started)

        outcomes = [self.detect(task) for task in started]
        try:
            stored = await self.results.submit(outcomes)
        except GroupWriteError as exc:
            return [], [self._nack(a, f"result not stored: {exc}") for a in assignments]
        self.refused += stored.count(False)
        acks = [scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token) for a in assignments]
        return acks, []

    def detect(self, task: Started) -> Outcome:
        if task.task_type == "TEXT":
            return detect_text(task, self.lexicon.matcher, self.worker_id)
        return failed(task, self.worker_id, f"this worker cannot run {task.task_type} tasks")

    @staticmethod
    def _nack(a: scheduler_pb2.Assignment, reason: str) -> scheduler_pb2.Nack:
        return scheduler_pb2.Nack(task_id=a.task_id, lease_token=a.lease_token, reason=reason,
                                  count_attempt=False)
