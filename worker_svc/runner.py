"""Running one assignment batch: mark RUNNING and read payloads (one round trip), detect, store results
(group commit), and say what to ack and nack.

A task the database does not hand back (already finished, cancelled, or owned by a newer attempt) is
acked without running: the ack clears this worker's lease if it is still the current one and is
refused otherwise.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC

from sieve.db.tasks import Outcome, Started, TaskStore
from sieve.v1 import scheduler_pb2
from worker_svc.detection import detect_text, failed
from worker_svc.lexicon import Lexicon
from worker_svc.result_writer import ResultWriteError, ResultWriter

log = logging.getLogger("sieve.worker.runner")


class BatchRunner:
    def __init__(self, tasks: TaskStore, writer: ResultWriter, lexicon: Lexicon, worker_id: str) -> None:
        self.tasks = tasks
        self.writer = writer
        self.lexicon = lexicon
        self.worker_id = worker_id
        self.skipped = 0

    async def __call__(self, assignments: list[scheduler_pb2.Assignment]
                       ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        attempts = [(uuid.UUID(a.task_id), a.attempt, a.assigned_at.ToDatetime(UTC)) for a in assignments]
        try:
            started = await self.tasks.start(self.worker_id, attempts)
        except Exception as exc:
            log.warning("could not start %d tasks: %s", len(assignments), exc)
            return [], [self._nack(a, f"database unavailable: {exc}") for a in assignments]
        self.skipped += len(assignments) - len(started)

        outcomes = [self.detect(task) for task in started]
        try:
            await self.writer.store(outcomes)
        except ResultWriteError as exc:
            return [], [self._nack(a, f"result not stored: {exc}") for a in assignments]
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
