"""Running one assignment batch: mark RUNNING and read payloads, detect, store results, say what to ack.

Both database steps go through group commits shared by every batch in flight, so a busy worker makes
one round trip and one commit for many batches. A task the database does not hand back (already
finished, cancelled, or owned by a newer attempt) is acked without running: the ack clears this
worker's lease if it is still the current one and is refused otherwise.

The first attempt of a fast type (TEXT: `UNMARKED_TYPES`, matched in microseconds) runs without a RUNNING mark:
its payload is read under the mark's condition, writing nothing (`TaskStore.read_unmarked`), and its result write
records ASSIGNED, RUNNING and the outcome at once, under the same fencing (`TaskStore.finish`): one row version and
one write per task instead of two. A mark would show the run for microseconds, and losing it changes nothing
(the result write carries its condition); a task tried again (it failed before) is marked, so that the record shows
which worker runs it while it does.

TEXT tasks are matched at once, on the event loop (microseconds each). OCR_IMAGE tasks, on a worker with
an `OcrRuntime`, go through `worker_svc.ocr.pipeline.run_ocr` all at once (decode on the decode pool,
recognition on the engine thread); with SIEVE_OCR_PAYLOAD_RETENTION=delete their image bytes are removed
once their results are stored (`sieve.db.payloads`).

Failures (`worker_svc.detection`): permanent ones are stored as FAILED; transient ones (and a PostgreSQL
write that failed) are nacked with the attempt counted, so the scheduler retries them with backoff and
dead-letters them at their max attempts. Execution timeout: each OCR task runs under `asyncio.timeout`
(`SIEVE_OCR_TIMEOUT_S`); past it the worker stops waiting and nacks it counted. Its inference thread cannot be
killed: if it was running, it keeps its slot (`SlotHolds`, read by the Puller) until it returns, and tasks
that reach the engine meanwhile are handed back uncounted (the engine's one thread is busy). A task that
timed out still waiting for the engine behind such work is handed back uncounted too. TEXT matching is
synchronous and bounded by the text's size, so no timer can stop it: its timeout is the scheduler's, which takes
back a hand-out past its type's timeout plus grace (a wedged worker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sieve.db.payloads import RETENTION_DELETE, PayloadStore
from sieve.db.tasks import Outcome, Started, TaskStore
from sieve.enums import enum_label
from sieve.observe import metrics
from sieve.redis.leases import lease_number
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, types_pb2
from worker_svc import tracing
from worker_svc.detection import ENGINE_BUSY, TIMEOUT, Retry, detect_text, failed
from worker_svc.group_commit import GroupCommit, GroupWriteError
from worker_svc.lexicon import Lexicon
from worker_svc.puller import SlotHolds

if TYPE_CHECKING:
    from worker_svc.ocr.runtime import OcrRuntime
    from worker_svc.text import Matcher

log = logging.getLogger("sieve.worker.runner")

Attempt = tuple[uuid.UUID, int, int, datetime]  # task id, lease, attempt, assigned at

#: a task that waited past its timeout for an engine held by abandoned work may run again after this long
ENGINE_BUSY_RETRY_S = 5.0
#: task types whose first attempt runs without a RUNNING mark (see the module)
UNMARKED_TYPES = frozenset({types_pb2.TASK_TYPE_TEXT})


#: stage timings of a result that are not the worker's work on the task: the wait for an engine (other tasks' work:
#: charging it would bill a cheap task queued behind a dear one for the dear one's time), the image fetch (a wait on
#: the network) and the total (every stage again, waits included)
NOT_WORKER_TIME = frozenset({"queue", "fetch", "total"})


def worker_time_ms(outcome: Outcome) -> int:
    """How long a task took this worker: the sum of the work stages its result names (`details.timings_ms`, without
    NOT_WORKER_TIME), in whole ms (0 when it names none); the scheduler charges the task's device for it (fair by
    cost)."""
    try:
        timings = json.loads(outcome.details_json).get("timings_ms", {})
        return max(
            0,
            round(sum(float(v) for k, v in timings.items() if k not in NOT_WORKER_TIME and isinstance(v, int | float))),
        )
    except (ValueError, AttributeError):
        return 0


class BatchRunner:
    """Runs the assignment batches the Puller hands it and says what to ack and what to nack (see the module).

    Owns the group commits of every batch in flight (`starts`: the RUNNING marks, `reads`: the payloads of hand-outs
    run without a mark, `results`: the results),
    the OCR pipeline's timeouts and the `SlotHolds` of abandoned inferences, and the counts the metrics read
    (skipped, refused, abandoned)."""

    def __init__(
        self, tasks: TaskStore, lexicon: Lexicon, worker_id: str, settings: Settings, ocr: OcrRuntime | None = None
    ) -> None:
        self.tasks = tasks
        self.settings = settings
        self.lexicon = lexicon
        self.worker_id = worker_id
        #: OCR of OCR_IMAGE tasks (None: this worker fails them)
        self.ocr = ocr
        self.payloads = PayloadStore(tasks.pool)
        self.drop_images = settings.ocr_payload_retention == RETENTION_DELETE
        self.starts: GroupCommit[Attempt, Started | None] = GroupCommit(
            "start", self._start, max_items=settings.result_flush_rows
        )
        self.reads: GroupCommit[Attempt, Started | None] = GroupCommit(
            "read", self._read, max_items=settings.result_flush_rows
        )
        self.results: GroupCommit[Outcome, bool] = GroupCommit(
            "results", self._finish, max_items=settings.result_flush_rows
        )
        self.skipped = 0
        self.refused = 0
        #: tasks abandoned past their execution timeout
        self.abandoned = 0
        #: slots of abandoned work whose thread still runs (the Puller keeps them taken)
        self.holds = SlotHolds()

    @property
    def writers(
        self,
    ) -> tuple[GroupCommit[Attempt, Started | None], GroupCommit[Attempt, Started | None], GroupCommit[Outcome, bool]]:
        """The group commits whose writer loops (`run`) the worker keeps running: RUNNING marks, reads, results."""
        return self.starts, self.reads, self.results

    async def _start(self, attempts: Sequence[Attempt]) -> list[Started | None]:
        started = {s.task_id: s for s in await self.tasks.start(self.worker_id, attempts)}
        return [started.get(task_id) for task_id, *_ in attempts]

    async def _read(self, attempts: Sequence[Attempt]) -> list[Started | None]:
        started = {s.task_id: s for s in await self.tasks.read_unmarked(attempts)}
        return [started.get(task_id) for task_id, *_ in attempts]

    async def _begin(self, assignments: list[scheduler_pb2.Assignment]) -> list[Started]:
        """The tasks of a batch this worker may run now, with their payloads: marked RUNNING, or read for a run
        without a mark (the first attempt of an `UNMARKED_TYPES` type); in the batch's order."""
        marked: list[Attempt] = []
        unmarked: list[Attempt] = []
        for a in assignments:
            # the lease token is the fencing token of this hand-out; attempt is the one that counts
            attempt = (uuid.UUID(a.task_id), lease_number(a.lease_token), a.attempt, a.assigned_at.ToDatetime(UTC))
            (unmarked if a.type in UNMARKED_TYPES and a.attempt == 1 else marked).append(attempt)
        if not marked:
            return [s for s in await self.reads.submit(unmarked) if s is not None]
        if not unmarked:
            return [s for s in await self.starts.submit(marked) if s is not None]
        began = await asyncio.gather(self.starts.submit(marked), self.reads.submit(unmarked))
        by_id = {s.task_id: s for found in began for s in found if s is not None}
        return [by_id[t] for t in (uuid.UUID(a.task_id) for a in assignments) if t in by_id]

    async def _finish(self, outcomes: Sequence[Outcome]) -> list[bool]:
        stored = await self.tasks.finish(outcomes)
        return [o.task_id in stored for o in outcomes]

    async def __call__(
        self, assignments: list[scheduler_pb2.Assignment]
    ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        try:
            started = await self._begin(assignments)
        except GroupWriteError as exc:  # a PostgreSQL write that failed: transient, counted
            return [], [self._nack(a, Retry(a.task_id, f"database unavailable: {exc}")) for a in assignments]
        self.skipped += len(assignments) - len(started)
        tracing.started(started)

        detected = await self.detect_all(started)
        outcomes = [d for d in detected if isinstance(d, Outcome)]
        retries = {d.task_id: d for d in detected if isinstance(d, Retry)}
        tracing.detected(outcomes)
        try:
            stored = await self.results.submit(outcomes)
        except GroupWriteError as exc:
            for o in outcomes:
                retries[str(o.task_id)] = Retry(str(o.task_id), f"result not stored: {exc}")
            stored = []
        refused = stored.count(False)
        if refused:
            self.refused += refused
            log.info(
                "%d results refused: their task was cancelled, finished, or handed out again since",
                refused,
                extra={"refused": refused},
            )
        if stored:
            tracing.stored(stored)
        if self.drop_images and stored:
            done = [t for t, d in zip(started, detected, strict=True) if isinstance(d, Outcome)]
            await self._drop_images(done, outcomes, stored)
        by_id = {str(uuid.UUID(a.task_id)): a for a in assignments}
        nacks = [self._nack(by_id[task_id], retry) for task_id, retry in retries.items() if task_id in by_id]
        handed_back = {n.task_id for n in nacks}
        cost = {str(o.task_id): worker_time_ms(o) for o in outcomes}
        acks = [
            scheduler_pb2.Ack(
                task_id=a.task_id, lease_token=a.lease_token, worker_time_ms=cost.get(str(uuid.UUID(a.task_id)), 0)
            )
            for a in assignments
            if a.task_id not in handed_back
        ]
        return acks, nacks

    async def detect_all(self, started: Sequence[Started]) -> list[Outcome | Retry]:
        """Outcomes (or retries) in task order: TEXT at once, OCR_IMAGE concurrently through the OCR pipeline,
        each under its execution timeout."""
        ocr = self.ocr
        if ocr is None or not any(t.task_type == "OCR_IMAGE" for t in started):
            return [self.detect(task) for task in started]
        matcher = self.lexicon.matcher
        images = [i for i, t in enumerate(started) if t.task_type == "OCR_IMAGE"]
        running = asyncio.gather(*(self._ocr(started[i], ocr, matcher) for i in images))
        outcomes: list[Outcome | Retry | None] = [
            None if t.task_type == "OCR_IMAGE" else self.detect(t) for t in started
        ]
        for i, outcome in zip(images, await running, strict=True):
            outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    async def _ocr(self, task: Started, ocr: OcrRuntime, matcher: Matcher) -> Outcome | Retry:
        """One OCR task within SIEVE_OCR_TIMEOUT_S; past it, abandoned (see the module)."""
        from worker_svc.ocr.pipeline import run_ocr
        from worker_svc.ocr.runtime import Progress

        progress = Progress()
        limit_s = self.settings.ocr_timeout_s
        try:
            async with asyncio.timeout(limit_s):
                return await run_ocr(task, ocr, matcher, self.worker_id, progress)
        except TimeoutError:
            task_id = str(task.task_id)
            self.abandoned += 1
            if progress.lingering is not None:
                self.holds.hold(task_id, progress.lingering)
            log.warning(
                "task %s abandoned after %gs (%s)%s",
                task_id,
                limit_s,
                progress.stage,
                "; its inference thread still runs and keeps its slot" if progress.lingering else "",
                extra={"task_id": task_id},
            )
            if progress.stage == "queued":  # it waited for the engine all along: not its fault
                return Retry(
                    task_id,
                    f"waited longer than {limit_s:g}s for the OCR engine",
                    ENGINE_BUSY,
                    counted=False,
                    retry_after_s=ENGINE_BUSY_RETRY_S,
                )
            return Retry(task_id, f"execution timed out: ran longer than {limit_s:g}s ({progress.stage})", TIMEOUT)

    async def _drop_images(
        self, started: Sequence[Started], outcomes: Sequence[Outcome], stored: Sequence[bool]
    ) -> None:
        """Retention "delete": image bytes of the tasks whose results were just stored are removed."""
        ids = [
            task.task_id
            for task, outcome, ok in zip(started, outcomes, stored, strict=True)
            if ok and task.image is not None and outcome.verdict is not None
        ]
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
    def _nack(a: scheduler_pb2.Assignment, retry: Retry) -> scheduler_pb2.Nack:
        """The nack of a task to hand back (kind and reason counted in sieve_task_nacks)."""
        metrics.TASK_NACKS.labels(enum_label(types_pb2.TaskType, a.type), retry.kind).inc()
        nack = scheduler_pb2.Nack(
            task_id=a.task_id, lease_token=a.lease_token, reason=retry.reason[:500], count_attempt=retry.counted
        )
        if retry.retry_after_s is not None:
            nack.retry_after.FromMilliseconds(int(retry.retry_after_s * 1000))
        return nack
