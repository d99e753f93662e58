"""What the scheduler tells PostgreSQL about hand-outs: ASSIGNED when it sends a task, PENDING again (with the
reason) when it takes one back — and the one path every take-back goes through (`Returns`).

`LifecycleWriter` keeps these status writes off the dispatch path: hand-outs and put-backs are queued as they
happen and written in groups (one statement per kind and group) by a loop of its own, retried a few times when
PostgreSQL is away, then dropped (logged): a lost status write loses a status, never a task, and the order of the
writes does not matter — each is fenced by the lease number (`TaskStore.assigned` / `put_back`).

An ASSIGNED record waits `ASSIGNED_DELAY_S` before it is written, and is not written at all when the hand-out is
settled meanwhile by an ack that PostgreSQL proved (the task is final, or handed out again since): such a write
would change nothing (`assigned` moves only open rows of an older lease), and the worker's own writes already
recorded ASSIGNED with the hand-out's time (`TaskStore.start`). Most hand-outs of fast task types end that way, so
they cost PostgreSQL no row version of the scheduler's. A hand-out taken back meanwhile has its ASSIGNED record
written at once, before the put-back's, so its history still tells the attempt; one still out after the delay has
it written then (a worker that has not started it yet shows ASSIGNED within the delay); `flush` writes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sieve.backoff import Backoff
from sieve.db.tasks import HandOut, PutBack, TaskStore
from sieve.redis.queue_store import QueueStore, Requeued, now_ms

log = logging.getLogger("sieve.scheduler.lifecycle")

#: rows per statement
GROUP_ROWS = 1000
#: tries of one group before it is dropped
WRITE_TRIES = 6
#: writes kept while PostgreSQL is away; beyond, the oldest ASSIGNED records are dropped first
MAX_QUEUED = 200_000
#: how long an ASSIGNED record waits for its hand-out to be settled (then it is not written at all)
ASSIGNED_DELAY_S = 1.0


class LifecycleWriter:
    """Queues ASSIGNED and put-back records and writes them in groups; ASSIGNED records wait `delay_s` first and
    are dropped when their hand-out is settled meanwhile (see the module)."""

    def __init__(self, tasks: TaskStore, delay_s: float = ASSIGNED_DELAY_S) -> None:
        self.tasks = tasks
        self.delay_s = delay_s
        self._assigned: list[HandOut] = []
        self._put_back: list[PutBack] = []
        #: ASSIGNED records waiting for their time, in the order they came: (task, lease) -> (due, record)
        self._deferred: dict[tuple[uuid.UUID, int], tuple[float, HandOut]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.written = 0
        self.dropped = 0
        #: ASSIGNED records not written because their hand-out was settled first
        self.skipped = 0

    def assigned(self, items: list[HandOut]) -> None:
        if items:
            due = time.monotonic() + self.delay_s
            for item in items:
                self._deferred[(item.task_id, item.lease)] = (due, item)
            self._bound()
            self._ensure_loop()

    def settled(self, hand_outs: Iterable[tuple[uuid.UUID, int]]) -> None:
        """Hand-outs (task, lease) whose ack PostgreSQL proved (the task is final, or handed out again since):
        their ASSIGNED record, when it still waits, would change nothing and is not written."""
        for key in hand_outs:
            if self._deferred.pop(key, None) is not None:
                self.skipped += 1

    async def write_waiting(self, hand_outs: Iterable[tuple[uuid.UUID, int]]) -> None:
        """Writes the waiting ASSIGNED records of these hand-outs (task, lease) now, before a final status that
        would refuse them (a dead letter): the task's history keeps the attempt."""
        group = [d[1] for key in hand_outs if (d := self._deferred.pop(key, None)) is not None]
        if group:
            await self._write("ASSIGNED", self.tasks.assigned, group)

    def put_back(self, items: list[PutBack]) -> None:
        if items:
            for item in items:  # the hand-out's ASSIGNED record goes first, so that its history tells the attempt
                deferred = self._deferred.pop((item.task_id, item.lease), None)
                if deferred is not None:
                    self._assigned.append(deferred[1])
            self._put_back.extend(items)
            self._queued()

    def _bound(self) -> None:
        excess = len(self._assigned) + len(self._put_back) + len(self._deferred) - MAX_QUEUED
        if excess <= 0:
            return
        waiting = list(self._deferred)[:excess]
        for key in waiting:
            del self._deferred[key]
        dropped = self._assigned[: excess - len(waiting)]
        del self._assigned[: len(dropped)]
        self.dropped += len(waiting) + len(dropped)

    def _queued(self) -> None:
        self._bound()
        self._idle.clear()
        self._wake.set()
        self._ensure_loop()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="lifecycle-writer")

    def _promote(self, until: float) -> None:
        """Waiting ASSIGNED records due by `until` join the next group."""
        while self._deferred:
            key, (due, item) = next(iter(self._deferred.items()))
            if due > until:
                return
            del self._deferred[key]
            self._assigned.append(item)

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Writes everything queued so far, the waiting ASSIGNED records included, and waits (at most `timeout_s`)
        until it was written or given up."""
        if self._deferred:
            self._promote(float("inf"))
            self._queued()
        if self._loop_task is None:
            return
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=timeout_s)
        except TimeoutError:
            log.warning("lifecycle writes still pending after %.0fs", timeout_s)

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task

    async def _run(self) -> None:
        """Writes what is queued, group after group, and what waited once it is due; ends when nothing is left
        (the next record starts it again)."""
        while True:
            self._promote(time.monotonic())
            if self._assigned or self._put_back:
                self._idle.clear()
                assigned, self._assigned = self._assigned, []
                put_back, self._put_back = self._put_back, []
                for i in range(0, len(assigned), GROUP_ROWS):
                    await self._write("ASSIGNED", self.tasks.assigned, assigned[i : i + GROUP_ROWS])
                for i in range(0, len(put_back), GROUP_ROWS):
                    await self._write("put-back", self.tasks.put_back, put_back[i : i + GROUP_ROWS])
                continue
            self._idle.set()
            if not self._deferred:
                return
            due, _ = next(iter(self._deferred.values()))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, due - time.monotonic()))

    async def _write(self, kind: str, write: Any, group: list[Any]) -> None:
        backoff = Backoff(base_s=0.1, max_s=2.0)
        for attempt in range(1, WRITE_TRIES + 1):
            try:
                result = await write(group)
                if kind == "put-back":  # rows a worker was writing were skipped: those again, a moment later
                    skipped = set(result[1])
                    if skipped and attempt < WRITE_TRIES:
                        self.written += len(group) - len(skipped)
                        group = [item for item in group if item.task_id in skipped]
                        await asyncio.sleep(backoff.next())
                        continue
                self.written += len(group)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == WRITE_TRIES:
                    self.dropped += len(group)
                    log.error("%d %s records not written after %d tries: %s", len(group), kind, attempt, exc)
                    return
                await asyncio.sleep(backoff.next())


@dataclass(frozen=True, slots=True)
class Returned:
    """One hand-out going back: its task, its lease number (None: whatever lease; then nothing is recorded in
    PostgreSQL) and the worker it was handed to."""

    task_id: str
    lease: int | None
    worker_id: str = ""


class Recorder(Protocol):
    """Where a take-back's outcomes are recorded (`scheduler_svc.outcomes.Outcomes`): the task rows (the tasks'
    own attempt limits are read there), dead letters, and the PENDING records."""

    @property
    def tasks(self) -> TaskStore: ...

    @property
    def lifecycle(self) -> LifecycleWriter: ...

    async def dead_lettered(self, records: list[dict[str, Any]]) -> None: ...


class Returns:
    """Puts hand-outs back (see the module): Redis, dead letters at the task's limit, the PENDING record."""

    def __init__(self, queues: QueueStore, outcomes: Recorder) -> None:
        self.queues = queues
        self.outcomes = outcomes
        self.settings = queues.settings

    async def limits(self, task_ids: list[str]) -> dict[str, int]:
        """The tasks' own attempt limits (only those that have one), bounded by the setting; {} when PostgreSQL
        does not answer (the setting then applies)."""
        if not task_ids:
            return {}
        try:
            found = await self.outcomes.tasks.max_attempts_of([uuid.UUID(t) for t in task_ids])
        except Exception as exc:
            log.warning("attempt limits of %d tasks not read (%s): the global limit applies", len(task_ids), exc)
            return {}
        cap = self.settings.max_attempts
        return {str(t): min(cap, n) for t, n in found.items() if n < cap}

    async def put_back(
        self,
        mac: str,
        items: list[Returned],
        *,
        counted: bool,
        reason: str,
        detail: str | None = None,
        retry_at_ms: float | None = None,
        now: float | None = None,
    ) -> Requeued:
        """Requeues one device's hand-outs (after `retry_at_ms` when it is in the future), dead-letters counted
        ones at their limit (`reason` is the dead letter's error), and records the others PENDING with `detail`
        (default: the reason) in their history. Returns what Redis did."""
        if not items:
            return Requeued(0, [])
        now = now or now_ms()
        limits = await self.limits([i.task_id for i in items]) if counted else {}
        groups: dict[int | None, list[Returned]] = defaultdict(list)
        for item in items:
            groups[limits.get(item.task_id)].append(item)
        requeued, dead, taken = 0, [], []
        for limit, group in groups.items():
            result = await self.queues.requeue(
                mac,
                [(i.task_id, i.lease) for i in group],
                count_attempt=counted,
                reason=reason,
                retry_at_ms=retry_at_ms,
                max_attempts=limit,
                now=now,
            )
            requeued += result.requeued
            dead += result.dead_letters
            taken += result.put_back
        if dead:  # their hand-outs' ASSIGNED records first, or the final status would refuse them
            gone = {record["task_id"] for record in dead}
            await self.outcomes.lifecycle.write_waiting(
                (uuid.UUID(i.task_id), i.lease) for i in items if i.lease is not None and i.task_id in gone
            )
        await self.outcomes.dead_lettered(dead)
        retry_at = (
            datetime.fromtimestamp(retry_at_ms / 1000, UTC) if retry_at_ms is not None and retry_at_ms > now else None
        )
        mine = set(taken)  # only what this call took back is recorded (another replica may have raced it)
        self.outcomes.lifecycle.put_back(
            [
                PutBack(uuid.UUID(i.task_id), i.lease, i.worker_id, detail or reason, counted, retry_at)
                for i in items
                if i.lease is not None and i.task_id in mine
            ]
        )
        return Requeued(requeued, dead, taken)
