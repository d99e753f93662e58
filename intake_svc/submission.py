"""Accepting tasks: admission check, the task row in PostgreSQL first, then the Redis enqueue.

A task is accepted only once both are done. If the enqueue is refused (a limit was reached meanwhile)
or fails, the row is withdrawn, so nothing is left half-accepted; a repeated idempotency key returns the
first task without queueing anything again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from intake_svc.admission import RetryAdvisor
from intake_svc.observe import count_decisions, enqueue_span, stamp_trace
from sieve.db.tasks import NewTask, TaskStore
from sieve.entry import Entry
from sieve.errors import AdmissionRefused, ScriptCode
from sieve.queue_store import QueueStore
from sieve.settings import Settings

log = logging.getLogger("sieve.intake.submission")


@dataclass(frozen=True, slots=True)
class Accepted:
    task_id: uuid.UUID
    deduplicated: bool


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    message: str
    retry_after_s: float


Decision = Accepted | Refused


def _entry(task: NewTask, enqueued_ms: int) -> Entry:
    return Entry(str(task.task_id), task.task_type, task.priority, enqueued_ms,
                 int(task.expires_at.timestamp() * 1000), trace=task.trace_context or "")


class Submitter:
    """Admits, records and enqueues validated tasks; one instance per intake process."""

    def __init__(self, tasks: TaskStore, queues: QueueStore, settings: Settings) -> None:
        self.tasks = tasks
        self.queues = queues
        self.settings = settings
        #: retry delays of refusals (the global one from the measured drain rate)
        self.retry = RetryAdvisor(queues, settings)

    async def submit(self, batch: list[NewTask]) -> list[Decision]:
        """Decides every task of the batch, in order. Raises when PostgreSQL or Redis is unreachable
        (then nothing of the batch was accepted)."""
        batch = stamp_trace(batch)  # the Submit's trace goes with each task (row and queue entry)
        decisions: list[Decision | None] = [None] * len(batch)

        # 1. cheap check before writing anything: refuse devices (or all) that are already full
        devices = sorted({t.device for t in batch})
        pending, backlogs = await self.queues.admission_snapshot(devices)
        incoming: dict[str, int] = defaultdict(int)
        for t in batch:
            incoming[t.device] += 1
        admitted: list[int] = []
        for i, t in enumerate(batch):
            if pending + len(batch) > self.settings.max_total_pending:
                full = AdmissionRefused(ScriptCode.GLOBAL_LIMIT, 0, pending)
                decisions[i] = await self._refusal(full, t, len(batch))
            elif backlogs[t.device] + incoming[t.device] > self.settings.max_per_device_pending:
                refusal = AdmissionRefused(ScriptCode.DEVICE_LIMIT, backlogs[t.device], pending)
                decisions[i] = await self._refusal(refusal, t, incoming[t.device])
            else:
                admitted.append(i)
        if not admitted:
            return count_decisions([d for d in decisions if d is not None])

        # 2. the record first
        recorded = await self.tasks.insert([batch[i] for i in admitted])
        fresh: dict[str, list[int]] = defaultdict(list)
        for i, rec in zip(admitted, recorded, strict=True):
            if rec.created:
                fresh[batch[i].device].append(i)
            else:
                decisions[i] = Accepted(rec.task_id, deduplicated=True)

        # 3. then the queues, one atomic admission + enqueue per device
        if fresh:
            now_ms = int(time.time() * 1000)
            groups = {mac: [_entry(batch[i], now_ms) for i in idx] for mac, idx in fresh.items()}
            try:
                with enqueue_span(groups):
                    results = await self.queues.enqueue_many(groups, now=now_ms)
            except Exception:
                await self._withdraw([batch[i].task_id for idx in fresh.values() for i in idx])
                raise
            withdrawn: list[uuid.UUID] = []
            for mac, idx in fresh.items():
                outcome = results[mac]
                if isinstance(outcome, AdmissionRefused):
                    withdrawn += [batch[i].task_id for i in idx]
                    for i in idx:
                        decisions[i] = await self._refusal(outcome, batch[i], len(idx))
                else:
                    for i in idx:
                        decisions[i] = Accepted(batch[i].task_id, deduplicated=False)
            if withdrawn:
                await self._withdraw(withdrawn)
        return count_decisions([d for d in decisions if d is not None])

    async def _refusal(self, refusal: AdmissionRefused, task: NewTask, incoming: int) -> Refused:
        meta: dict[str, str] = {}
        if not refusal.is_global:
            await self.queues.mark_overloaded(task.device)
            meta = await self.queues.device_meta(task.device)
        delay = await self.retry.after_s(refusal, meta, incoming)
        reason = "global_limit" if refusal.is_global else "device_limit"
        what = "Sieve is at its global pending limit" if refusal.is_global else (
            f"device {task.device} is at its pending limit ({self.settings.max_per_device_pending})")
        return Refused(reason, f"{what}; retry in {delay:.1f}s", delay)

    async def _withdraw(self, task_ids: list[uuid.UUID]) -> None:
        try:
            await self.tasks.withdraw(task_ids)
        except Exception:  # the rows stay PENDING; a Redis rebuild from PostgreSQL queues them
            log.exception("could not withdraw %d unqueued tasks", len(task_ids))
