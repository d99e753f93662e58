"""Running one assignment batch: mark RUNNING and read payloads, detect, store results, say what to ack.

Both database steps go through group commits shared by every batch in flight, so a busy worker makes
one round trip and one commit for many batches. A task the database does not hand back (already
finished, cancelled, or owned by a newer attempt) is acked without running: the ack clears this
worker's lease if it is still the current one and is refused otherwise.

TEXT tasks are matched at once, on the event loop (microseconds each). OCR_IMAGE tasks, on a worker with
an `OcrRuntime`, go through `worker_svc.ocr.pipeline.run_ocr` all at once (decode on the decode pool,
recognition on the engine thread); with SIEVE_OCR_PAYLOAD_RETENTION=delete their image bytes are removed
once their results are stored (`sieve.db.payloads`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sieve.db.payloads import RETENTION_DELETE, PayloadStore
from sieve.db.tasks import Outcome, Started, TaskStore
from sieve.lease import lease_number
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2
from worker_svc import task_trace
from worker_svc.detection import detect_text, failed
from worker_svc.group_commit import GroupCommit, GroupWriteError
from worker_svc.lexicon import Lexicon

if TYPE_CHECKING:
    from worker_svc.ocr.runtime import OcrRuntime

log = logging.getLogger("sieve.worker.runner")

Attempt = tuple[uuid.UUID, int, int, datetime]  # task id, lease, attempt, assigned at


class BatchRunner:
    def __init__(self, tasks: TaskStore, lexicon: Lexicon, worker_id: str, settings: Settings,
                 ocr: OcrRuntime | None = None) -> None:
        self.tasks = tasks
        self.lexicon = lexicon
        self.worker_id = worker_id
        #: OCR of OCR_IMAGE tasks (None: this worker fails them)
        self.ocr = ocr
        self.payloads = PayloadStore(tasks.pool)
        self.drop_images = settings.ocr_payload_retention == RETENTION_DELETE
        self.starts: GroupCommit[Attempt, Started | None] = GroupCommit(
            "start", self._start, max_items=settings.result_flush_rows)
        self.results: GroupCommit[Outcome, bool] = GroupCommit(
            "results", self._finish, max_items=settings.result_flush_rows)
        self.skipped = 0
        self.refused = 0

    async def _start(self, attempts: Sequence[Attempt]) -> list[Started | None]:
        started = {s.task_id: s for s in await self.tasks.start(self.worker_id, attempts)}
        return [started.get(task_id) for task_id, *_ in attempts]

    async def _finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        stored = await self.tasks.finish(outcomes)
        return [o.task_id in stored for o in outcomes]

    async def __call__(self, assignments: list[scheduler_pb2.Assignment]
                       ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        # the lease token is the fencing token of this hand-out; attempt is the one that counts
        attempts = [(uuid.UUID(a.task_id), lease_number(a.lease_token), a.attempt, a.assigned_at.ToDatetime(UTC))
                    for a in assignments]
        try:
            started = [s for s in await self.starts.submit(attempts) if s is not None]
        except GroupWriteError as exc:  # PostgreSQL away: give the batch back, uncounted
            return [], [self._nack(a, f"database unavailable: {exc}") for a in assignments]
        self.skipped += len(assignments) - len(started)
        task_trace.started(started)

        outcomes = await self.detect_all(started)
        task_trace.detected(outcomes)
        try:
            stored = await self.results.submit(outcomes)
        except GroupWriteError as exc:
            return [], [self._nack(a, f"result not stored: {exc}") for a in assignments]
        refused = stored.count(False)
        if refused:
            self.refused += refused
            log.info("%d results refused: their task was cancelled, finished, or handed out again since", refused,
                     extra={"refused": refused})
        task_trace.stored(stored)
        if self.drop_images:
            await self._drop_images(started, outcomes, stored)
        acks = [scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token) for a in assignments]
        return acks, []

    async def detect_all(self, started: Sequence[Started]) -> list[Outcome]:
        """Outcomes in task order: TEXT at once, OCR_IMAGE concurrently through the OCR pipeline."""
        ocr = self.ocr
        if ocr is None or not any(t.task_type == "OCR_IMAGE" for t in started):
            return [self.detect(task) for task in started]
        from worker_svc.ocr.pipeline import run_ocr

        matcher = self.lexicon.matcher
        images = [i for i, t in enumerate(started) if t.task_type == "OCR_IMAGE"]
        running = asyncio.gather(*(run_ocr(started[i], ocr, matcher, self.worker_id) for i in images))
        outcomes: list[Outcome | None] = [None if t.task_type == "OCR_IMAGE" else self.detect(t) for t in started]
        for i, outcome in zip(images, await running, strict=True):
            outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    async def _drop_images(self, started: Sequence[Started], outcomes: Sequence[Outcome],
                           stored: Sequence[bool]) -> None:
        """Retention "delete": image bytes of the tasks whose results were just stored are removed."""
        ids = [task.task_id for task, outcome, ok in zip(started, outcomes, stored, strict=True)
               if ok and task.image is not None and outcome.verdict is not None]
        if not ids:
            return
        try:
            await self.payloads.drop_images(ids)
        except Exception as exc:  # the results are stored; a leftover image is only space
            log.warning("could not remove the image bytes of %d tasks: %s", len(ids), exc)

    def detect(self, task: Started) -> Outcome:
        if task.task_type == "TEXT":
            return detect_text(task, self.lexicon.matcher, self.worker_id)
        return failed(task, self.worker_id, f"this worker cannot run {task.task_type} tasks")

    @staticmethod
    def _nack(a: scheduler_pb2.Assignment, reason: str) -> scheduler_pb2.Nack:
        return scheduler_pb2.Nack(task_id=a.task_id, lease_token=a.lease_token, reason=reason,
                                  count_attempt=False)
