"""The periodic tick (the seed's Beat), off the hot path: resume devices whose backoff ended, take back
leases that ran out, renew leases of tasks live workers still hold, free devices whose dispatcher died,
and publish the watermark."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from scheduler_svc.board import Board, Session
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.rebuild import Rebuilder
from scheduler_svc.reconcile import Reconciler
from scheduler_svc.watermark import Watermark
from sieve.db.tasks import TaskStore
from sieve.queue_store import QueueStore, now_ms
from sieve.workers import WorkerRecords

log = logging.getLogger("sieve.scheduler.housekeeping")


class Housekeeping:
    def __init__(self, queues: QueueStore, tasks: TaskStore, board: Board, outcomes: Outcomes,
                 watermark: Watermark, dispatcher: Dispatcher, records: WorkerRecords,
                 end_session: Callable[[Session, str], Awaitable[None]], rebuilder: Rebuilder) -> None:
        self.queues = queues
        self.rebuilder = rebuilder
        self.tasks = tasks
        self.records = records
        self.end_session = end_session
        self.board = board
        self.outcomes = outcomes
        self.watermark = watermark
        self.dispatcher = dispatcher
        self.settings = queues.settings
        self.lease_reclaims = 0
        self._last_watermark = 0.0
        self._last_ttl_sweep = 0.0
        self._missing_since: dict[Session, float] = {}
        self.expired_swept = 0
        #: PostgreSQL's open tasks against Redis, in a loop of its own (a pass may take longer than a tick)
        self.reconciler = Reconciler(queues, tasks)

    async def run(self) -> None:
        reconciling = asyncio.create_task(self.reconciler.run(), name="reconcile")
        try:
            while True:
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("housekeeping tick failed")
                await asyncio.sleep(self.settings.housekeeping_interval_s)
        finally:
            reconciling.cancel()

    async def tick(self) -> None:
        if await self.rebuilder.ensure():
            self.dispatcher.wake.set()
        now = now_ms()
        if await self.queues.resume_due(now=now) or await self.queues.promote_due(now=now):
            self.dispatcher.wake.set()
        # leases held by this replica's live workers stay alive; the rest may run out
        await self.queues.renew_leases(self.board.live_held_task_ids(self.settings.lease_ttl_s / 2), now=now)
        await self.reclaim_expired_leases(now)
        await self.free_abandoned_devices(now)
        await self.check_workers()
        if time.monotonic() - self._last_ttl_sweep >= self.settings.ttl_sweep_interval_s:
            self._last_ttl_sweep = time.monotonic()
            await self.sweep_expired()
        if time.monotonic() - self._last_watermark >= self.settings.watermark_interval_s:
            self._last_watermark = time.monotonic()
            await self.watermark.publish()

    async def reclaim_expired_leases(self, now: int) -> int:
        """Leases nobody renewed (their worker or scheduler died) go back to their device queues."""
        due = await self.queues.leases_due(now=now)
        count = 0
        for mac, leases in due.items():
            result = await self.queues.requeue(mac, list(leases), count_attempt=True, reason="lease expired")
            count += result.requeued + len(result.dead_letters)
            await self.outcomes.dead_lettered(result.dead_letters)
        if count:
            self.lease_reclaims += count
            self.dispatcher.wake.set()
            log.info("reclaimed %d expired leases", count)
        return count

    async def free_abandoned_devices(self, now: int) -> None:
        """Devices whose dispatcher died holding the lock are released once the lock has expired."""
        redis = self.queues.redis
        stale = await redis.zrangebyscore(self.queues.keys.serving, "-inf", now, start=0, num=100)
        for mac in stale:
            if not await redis.exists(self.queues.keys.lock(mac)):
                await self.queues.release(mac, "*", now=now)
                self.dispatcher.wake.set()

    async def sweep_expired(self) -> int:
        """PENDING tasks past their TTL leave their queues and become EXPIRED (pops drop them too)."""
        count = 0
        for task_id, mac in await self.tasks.expired_pending():
            if await self.queues.remove_queued(mac, str(task_id)) is not None:
                await self.tasks.transition([task_id], "EXPIRED", "TTL passed while queued", error="expired",
                                            only_from=("PENDING",))
                count += 1
        self.expired_swept += count
        if count:
            log.info("expired %d queued tasks", count)
        return count

    async def check_workers(self) -> None:
        """Reads the registry: whether a GPU worker is alive anywhere or was recently (routing), and which connected
        workers stopped heartbeating (their sessions end; what they held is handed out again)."""
        records = {r.worker_id: r for r in await self.records.list()}
        await self.dispatcher.router.observe(records.values())
        now = time.monotonic()
        for session in list(self.board.sessions):
            if session.worker_id in records:
                self._missing_since.pop(session, None)
                continue
            since = self._missing_since.setdefault(session, now)
            if now - since > self.settings.worker_ttl_s:
                log.warning("worker %s has no registration for %.0fs: ending its stream", session.worker_id,
                            now - since, extra={"worker": session.worker_id})
                self._missing_since.pop(session, None)
                await self.end_session(session, "worker registration expired")
        for session in list(self._missing_since):
            if session.closed:
                self._missing_since.pop(session, None)
