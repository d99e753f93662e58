"""Reconciliation: PostgreSQL is the record, and Redis must match it.

Every task PostgreSQL shows open (PENDING, ASSIGNED, RUNNING) must sit in exactly one place in Redis: its device's
queues, a lease, or the delayed set. Redis can lose one without the rest of Sieve noticing: an intake killed
between the task's row and its enqueue (the client's retry is then told `deduplicated` about a task no queue
holds), a key deleted or evicted behind Sieve's back, a Lua effect lost. A rebuild (scheduler_svc/rebuild.py)
covers Redis losing everything; this covers losing a part. Once per interval one scheduler replica (whichever
takes the reconciliation turn first: `SchedulerState.take_turn`, SET NX PX for one interval) makes a pass:

1. Keyset pages of open tasks unchanged for the grace period, in (device, id) order, over a partial index that
   holds open tasks only (migration 0009): a pass reads as many index entries as there are open tasks, however
   many finished rows the table holds. The grace period (default the lease TTL) leaves alone a Submit between
   its row and its enqueue, and the moment between a Lua script and the PostgreSQL write that follows it.
2. One pipelined round trip per page: a read-only `locateTasks` call per device reads its queues once and looks
   each id up in the lease hash. Ids found nowhere and not in a snapshot of the delayed set (read once per pass)
   are candidates. The snapshot is not atomic with the look (a task may move between queue and delayed set in
   between), so candidates are confirmed by an exact look (`locateTasks` with the delayed set searched too, all in
   one script: the whole truth at one instant) before anything is done.
3. Confirmed, under the rebuild lock and only while the Redis generation is still the one the pass started in
   (no rebuild can interleave, and a Redis that lost its memory meanwhile refuses the enqueue), and only for rows
   still open and unchanged since they were read: a task whose newest dead-letter record is newer than its row's
   last change is recorded DEAD_LETTERED (that write was lost); one past its TTL is recorded EXPIRED (what a pop
   would do); every other one is queued again through `QueueStore.enqueue_many` (admission off, every counter
   kept by the enqueue script) with a fenced attempt: PostgreSQL's lease number plus `reconcile_fence_step`.
   Redis raises a task's attempt by one per hand-out and PostgreSQL learns a lease number only when a worker
   starts, so hand-outs PostgreSQL never saw may hold numbers above its lease; the step puts the new hand-out
   above them, so that their late starts are refused and their results too once it started. PostgreSQL's lease
   is not raised here: an older entry brought back by a rebuild would then never start. Its history gets a
   note; its status is left as it was (a RUNNING task goes back to RUNNING when it starts again).
4. A device whose own keys disagree (backlog against its queues, state against its schedule sets, lock, serving
   and backoff sets) is mended by `repairDevice` (atomically checked again), and so is every device that sits
   in a schedule set its meta does not put it in (a deleted meta: the dispatcher would claim it in vain). A
   lease without a deadline gets one. A task found twice is reported, not changed.
5. A pass that found anything recounts the global pending counter from the queues (`recountPending`): a deleted
   queue list's tasks were still counted, and re-queueing them counted them again.

A lost task is queued again within grace + interval + one pass (default 60 + 30 s + the pass); the fault suite
runs with a 3 s lease TTL. Not mended: the per-caller open-task counts of tasks whose queue entries were
deleted (recounting them would read every entry in Redis); a duplicate entry (it cannot be told which copy
is stale without PostgreSQL's help, and fencing keeps the result single).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from sieve.db.tasks import TaskStore, type_value
from sieve.errors import RedisNotReady
from sieve.observe import metrics
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.redis.scheduler_state import SchedulerState, Turn

log = logging.getLogger("sieve.scheduler.reconcile")

#: how long the re-queue step may hold the rebuild lock (it holds it for a few round trips)
REQUEUE_LOCK_MS = 10_000


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@dataclass
class PassReport:
    """What one reconciliation pass saw and did."""

    #: open tasks (past the grace period) looked up in Redis, in this many pages
    checked: int = 0
    pages: int = 0
    #: kinds of things found wrong and mended (the keys of metrics.RECONCILED): requeued, dead_lettered, expired,
    #: lease_deadline, device, pending_recount, duplicate
    found: Counter[str] = field(default_factory=Counter)
    #: the global pending counter before and after the recount, when one ran
    pending: tuple[int, int] | None = None
    #: why the pass stopped early ("" when it ran to the end)
    stopped: str = ""
    seconds: float = 0.0

    @property
    def wrong(self) -> bool:
        return any(n for kind, n in self.found.items() if kind != "pending_recount")


class Reconciler:
    """Owns reconciliation: the periodic pass that makes Redis hold every open task of PostgreSQL in exactly one
    place (queue, lease, delayed set) and mends the device keys and the pending counter that go with it. Runs in
    every scheduler replica; the turn key lets one pass start per interval."""

    def __init__(self, queues: QueueStore, tasks: TaskStore) -> None:
        self.queues = queues
        self.state = SchedulerState(queues)
        self.tasks = tasks
        self.settings = queues.settings
        self.replica = uuid.uuid4().hex[:12]
        self.passes = 0
        #: totals of PassReport.found over this replica's passes
        self.totals: Counter[str] = Counter()
        self.last: PassReport | None = None

    @property
    def interval_s(self) -> float:
        return self.settings.reconcile_interval_s or self.settings.lease_ttl_s / 2

    @property
    def grace_s(self) -> float:
        return self.settings.reconcile_grace_s or self.settings.lease_ttl_s

    @property
    def poll_s(self) -> float:
        """How often a replica tries for the turn: a few times per interval, at least every second."""
        return min(1.0, self.interval_s / 4)

    async def take_turn(self) -> str:
        """The replica's `reconcile` job (scheduler_svc/housekeeping.py), every `poll_s`: a pass when this replica
        gets the turn; what it did."""
        report = await self.maybe_pass()
        if report is None:
            return "not this replica's turn: a pass started within the interval"
        found = ", ".join(f"{n} {kind}" for kind, n in sorted(report.found.items()) if n) or "nothing wrong"
        stopped = f"; stopped early: {report.stopped}" if report.stopped else ""
        return f"pass: {report.checked} open tasks checked in {report.pages} pages, {found}{stopped}"

    async def maybe_pass(self) -> PassReport | None:
        """A pass, if no pass (by any replica) started within the last interval; None otherwise. The turn key
        lapses an interval after the pass started, or after it ended for a pass that ran longer."""
        token = f"{self.replica}:{uuid.uuid4().hex[:8]}"
        interval_ms = int(self.interval_s * 1000)
        if not await self.state.take_turn(Turn.RECONCILE, token, interval_ms):
            return None
        started = time.monotonic()

        async def keep() -> None:
            if time.monotonic() - started > self.interval_s / 2:
                await self.state.keep_turn(Turn.RECONCILE, token, interval_ms)

        return await self.run_pass(keep)

    async def run_pass(self, keep: Callable[[], Awaitable[None]] | None = None) -> PassReport:
        """One pass over every open task (see the module's docstring); `keep` is awaited between pages."""
        began = time.perf_counter()
        report = PassReport()
        generation = await self.queues.generation()
        if generation is None:
            report.stopped = "Redis has lost its memory and is not rebuilt yet"
            return report
        delayed = await self.queues.delayed_task_ids()
        after: tuple[str, uuid.UUID] | None = None
        page_rows = self.settings.reconcile_page_rows
        while not report.stopped:
            rows = await self.tasks.reconcile_page(after, page_rows, self.grace_s)
            if not rows:
                break
            after = (rows[-1]["device"], rows[-1]["id"])
            report.pages += 1
            report.checked += len(rows)
            await self._page(rows, generation, delayed, report)
            if len(rows) < page_rows:
                break
            if keep is not None:
                await keep()
        if not report.stopped:
            stray = await self.queues.misscheduled_devices()
            await self._repair(list(stray), report, stray)
        if report.wrong:
            recounted = await self.queues.recount_pending()
            if recounted is not None and recounted[0] != recounted[1]:
                report.pending = recounted
                report.found["pending_recount"] += 1
                log.warning("pending counter was %d, the queues hold %d: recounted", *recounted)
        report.seconds = time.perf_counter() - began
        self._record(report)
        return report

    def _record(self, report: PassReport) -> None:
        self.passes += 1
        self.last = report
        self.totals.update(report.found)
        metrics.RECONCILE_SECONDS.observe(report.seconds)
        metrics.RECONCILE_CHECKED.inc(report.checked)
        for kind, n in report.found.items():
            metrics.RECONCILED.labels(kind).inc(n)
        summary = ", ".join(f"{kind} {n}" for kind, n in sorted(report.found.items())) or "nothing wrong"
        level = logging.WARNING if report.wrong else logging.DEBUG
        log.log(
            level,
            "reconcile pass: %d open tasks checked in %d pages, %.1f ms: %s%s",
            report.checked,
            report.pages,
            report.seconds * 1000,
            summary,
            f" (stopped: {report.stopped})" if report.stopped else "",
        )

    async def _page(self, rows: list[asyncpg.Record], generation: str, delayed: set[str], report: PassReport) -> None:
        by_device: dict[str, list[str]] = defaultdict(list)
        by_id: dict[str, asyncpg.Record] = {}
        for r in rows:
            by_device[r["device"]].append(str(r["id"]))
            by_id[str(r["id"])] = r
        located = await self.queues.locate(by_device, exact=False)
        candidates: dict[str, list[str]] = {}
        unleased: list[str] = []
        for mac, loc in located.items():
            left = [task_id for task_id in loc.missing if task_id not in delayed]
            if left:
                candidates[mac] = left
            unleased += loc.unleased
            if loc.duplicated:
                report.found["duplicate"] += len(loc.duplicated)
                log.warning(
                    "device %s: %d tasks are in Redis twice (e.g. %s)",
                    mac,
                    len(loc.duplicated),
                    loc.duplicated[0],
                    extra={"device": mac},
                )
        if unleased:
            added = await self.queues.give_lease_deadlines(unleased)
            if added:
                report.found["lease_deadline"] += added
                log.warning("%d leases had no deadline: given one lease TTL", added)
        if candidates:
            await self._requeue(candidates, by_id, generation, report)
        await self._repair([mac for mac, loc in located.items() if loc.problem], report)

    async def _requeue(
        self, candidates: dict[str, list[str]], by_id: dict[str, asyncpg.Record], generation: str, report: PassReport
    ) -> None:
        """Confirms the candidates with an exact look and queues again those found nowhere, under the rebuild lock
        and in the generation the pass began in."""
        lock = uuid.uuid4().hex
        if not await self.state.take_turn(Turn.REBUILD, lock, REQUEUE_LOCK_MS):
            report.stopped = "Redis is being rebuilt"
            return
        dead: list[tuple[asyncpg.Record, dict[str, Any]]] = []
        expired: list[asyncpg.Record] = []
        queued: list[tuple[str, Entry]] = []
        try:
            if await self.queues.generation() != generation:
                report.stopped = "Redis was rebuilt during the pass"
                return
            located = await self.queues.locate(candidates, exact=True)
            missing = [by_id[task_id] for loc in located.values() for task_id in loc.missing]
            if not missing:
                return
            missing = await self.tasks.unchanged([(r["id"], r["lease"], r["updated_at"]) for r in missing])
            records = await self.queues.dead_letter_records() if missing else {}
            now = now_ms()
            groups: dict[str, list[Entry]] = defaultdict(list)
            for r in missing:
                record = records.get(str(r["id"]))
                if record is not None and record.get("dead_ms", 0) >= _ms(r["updated_at"]):
                    dead.append((r, record))
                elif _ms(r["expires_at"]) <= now:
                    expired.append(r)
                else:
                    entry = Entry(
                        str(r["id"]),
                        type_value(r["type"]),
                        r["priority"],
                        _ms(r["enqueued_at"]),
                        _ms(r["expires_at"]),
                        attempt=r["lease"] + self.settings.reconcile_fence_step,
                        failures=max(0, r["attempts"] - 1),
                        trace=r["trace_context"] or "",
                        caller=r["caller"] or "",
                    )
                    groups[r["device"]].append(entry)
                    queued.append((r["device"], entry))
            if groups:
                for entries in groups.values():  # in the order they entered their queue, as a rebuild would
                    entries.sort(key=lambda e: e.enqueued_ms)
                # noted first: a worker may finish a task as soon as it is queued, and a final task takes no note
                await self._note([e for _, e in queued])
                try:
                    await self.queues.enqueue_many(dict(groups), now=now, admit=False)
                except RedisNotReady:
                    report.stopped = "Redis lost its memory during the pass"
                    queued = []
        finally:
            await self.state.keep_turn(Turn.REBUILD, lock, 0)
        await self._record_found(queued, dead, expired, report)

    async def _record_found(
        self,
        queued: list[tuple[str, Entry]],
        dead: list[tuple[asyncpg.Record, dict[str, Any]]],
        expired: list[asyncpg.Record],
        report: PassReport,
    ) -> None:
        if queued:
            report.found["requeued"] += len(queued)
            log.warning(
                "reconciliation re-queued %d tasks not found in Redis, of %d devices (e.g. task %s of %s)",
                len(queued),
                len({mac for mac, _ in queued}),
                queued[0][1].task_id,
                queued[0][0],
            )
        for r, record in dead:
            error = str(record.get("error") or "dead-lettered")
            await self.tasks.transition(
                [r["id"]], "DEAD_LETTERED", f"{error} (recorded by reconciliation)", error=error
            )
        if dead:
            report.found["dead_lettered"] += len(dead)
            log.warning("%d dead-lettered tasks were still open in PostgreSQL: recorded", len(dead))
        if expired:
            await self.tasks.transition(
                [r["id"] for r in expired],
                "EXPIRED",
                "TTL passed while not found in Redis (reconciliation)",
                error="expired",
            )
            report.found["expired"] += len(expired)
            log.warning("%d expired tasks not found in Redis: recorded EXPIRED", len(expired))

    async def _note(self, entries: list[Entry]) -> None:
        try:
            await self.tasks.note_each(
                [
                    (uuid.UUID(e.task_id), f"re-queued by reconciliation: not found in Redis (lease {e.attempt})")
                    for e in entries
                ]
            )
        except Exception:  # the re-queue matters more than its note
            log.exception("could not note the re-queue of %d tasks", len(entries))

    async def _repair(self, macs: list[str], report: PassReport, groups: dict[str, str] | None = None) -> None:
        if not macs:
            return
        for mac, (problem, queued, backlog) in (await self.queues.repair_devices(macs, groups=groups)).items():
            report.found["device"] += 1
            log.warning(
                "device %s: %s (queues hold %d, its backlog said %d): mended",
                mac,
                problem,
                queued,
                backlog,
                extra={"device": mac},
            )
