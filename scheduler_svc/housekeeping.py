"""The periodic tick (the seed's Beat), off the hot path: resume devices whose backoff ended, take back
leases that ran out, renew leases of tasks live workers still hold, free devices whose dispatcher died,
and publish the watermark."""

from __future__ import annotations

import asyncio
import logging
import time

from scheduler_svc.board import Board
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.watermark import Watermark
from sieve.queue_store import QueueStore, now_ms

log = logging.getLogger("sieve.scheduler.housekeeping")


class Housekeeping:
    def __init__(self, queues: QueueStore, board: Board, outcomes: Outcomes, watermark: Watermark,
                 dispatcher: Dispatcher) -> None:
        self.queues = queues
        self.board = board
        self.outcomes = outcomes
        self.watermark = watermark
        self.dispatcher = dispatcher
        self.settings = queues.settings
        self.lease_reclaims = 0
        self._last_watermark = 0.0

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping tick failed")
            await asyncio.sleep(self.settings.housekeeping_interval_s)

    async def tick(self) -> None:
        now = now_ms()
        if await self.queues.resume_due(now=now):
            self.dispatcher.wake.set()
        # leases held by this replica's live workers stay alive; the rest may run out
        await self.queues.renew_leases(self.board.held_task_ids(), now=now)
        await self.reclaim_expired_leases(now)
        await self.free_abandoned_devices(now)
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
