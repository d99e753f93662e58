"""The scheduler's scrape-time metrics: its own counters, the queues in Redis, pending tasks in PostgreSQL.

Read at each scrape (Prometheus' default is every 15 s): one Redis pipeline of counts, one rank (the
longest wait), one grouped count of PENDING rows. Nothing is listed per device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from scheduler_svc.tracing import priority_name
from sieve.observe import metrics as m
from sieve.observe.metrics import ScrapeCollector

if TYPE_CHECKING:
    from scheduler_svc.app import SchedulerApp


class SchedulerCollector(ScrapeCollector):
    def __init__(self, scheduler: SchedulerApp) -> None:
        super().__init__()
        self.scheduler = scheduler

    def now(self) -> Iterable[Metric]:
        s = self.scheduler
        board = s.board
        yield m.DISPATCHED.family(s.dispatcher.dispatched)
        yield m.LEASE_RECLAIMS.family(s.housekeeping.lease_reclaims)
        yield m.FENCING_REFUSALS.family(s.servicer.fencing_refusals)
        yield m.EXPIRED.family(s.dispatcher.outcomes.expired_count)
        yield m.DEAD_LETTERED.family(s.dispatcher.outcomes.dead_letter_count)
        yield m.CONNECTED_WORKERS.family(len(board.sessions))
        yield m.SCHEDULER_CREDITS.family(board.credits)
        yield m.HELD_TASKS.family(sum(len(session.held) for session in board.sessions))
        yield m.RECONNECT_LEASES.family(((k,), v) for k, v in sorted(s.servicer.reconnect_leases.items()))
        yield m.ORPHANED_LEASES.family(s.housekeeping.orphans_put_back)
        yield m.EXECUTION_TIMEOUTS.family(((k,), v) for k, v in sorted(s.housekeeping.execution_timeouts.items()))

    async def read(self) -> list[Metric]:
        queues = self.scheduler.queues
        k = queues.keys
        async with queues.redis.pipeline(transaction=False) as pipe:
            pipe.get(k.pending)
            pipe.zcard(k.leases)
            pipe.zcard(k.delayed)
            pipe.scard(k.devices)
            pipe.scard(k.overloaded)
            pipe.zcard(k.backoff)
            pipe.llen(k.dead_letters)
            pending, leased, delayed, devices, overloaded, backoff, dead = await pipe.execute()
        rank = await queues.rank()
        classes = await self.scheduler.housekeeping.tasks.pending_by_class()
        return [
            m.QUEUED.family(int(pending or 0)),
            m.LEASED.family(leased),
            m.DELAYED.family(delayed),
            m.ACTIVE_DEVICES.family(devices),
            m.OVERLOADED_DEVICES.family(overloaded),
            m.BACKOFF_DEVICES.family(backoff),
            m.DEAD_LETTERS.family(dead),
            m.OLDEST_WAIT.family((rank.longest_wait_ms or 0) / 1000),
            m.PENDING.family(((priority_name(p), t), n) for p, t, n in classes),
        ]


__all__ = ["SchedulerCollector"]
