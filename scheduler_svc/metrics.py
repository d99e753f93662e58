"""The scheduler's scrape-time metrics: its own counters, the queues in Redis, pending tasks in PostgreSQL.

Read at each scrape (Prometheus' default is every 15 s): one Redis pipeline of counts
(`SchedulerState.gauges`, the one GetWatermark reads too), one rank (the longest wait), one grouped count of
PENDING rows. Nothing is listed per device.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from scheduler_svc.board import Board
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.housekeeping import Housekeeping
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.streams import PullStreams
from sieve.db.tasks import TaskStore
from sieve.enums import enum_label
from sieve.observe import metrics as m
from sieve.observe.metrics import ScrapeCollector
from sieve.redis.queue_store import QueueStore
from sieve.redis.scheduler_state import SchedulerState
from sieve.v1.types_pb2 import Priority


class SchedulerCollector(ScrapeCollector):
    """One replica's metrics: the counters its parts keep (read from memory) and, at each scrape, the gauges of
    Redis and the PENDING counts of PostgreSQL."""

    def __init__(
        self,
        *,
        board: Board,
        dispatcher: Dispatcher,
        streams: PullStreams,
        housekeeping: Housekeeping,
        outcomes: Outcomes,
        state: SchedulerState,
        queues: QueueStore,
        tasks: TaskStore,
    ) -> None:
        super().__init__()
        self.board = board
        self.dispatcher = dispatcher
        self.streams = streams
        self.housekeeping = housekeeping
        self.outcomes = outcomes
        self.state = state
        self.queues = queues
        self.tasks = tasks

    def now(self) -> Iterable[Metric]:
        board, streams, housekeeping = self.board, self.streams, self.housekeeping
        yield m.DISPATCHED.family(self.dispatcher.dispatched)
        yield m.LEASE_RECLAIMS.family(housekeeping.lease_reclaims)
        yield m.FENCING_REFUSALS.family(streams.fencing_refusals)
        yield m.EXPIRED.family(self.outcomes.expired_count)
        yield m.DEAD_LETTERED.family(self.outcomes.dead_letter_count)
        yield m.CONNECTED_WORKERS.family(len(board.sessions))
        yield m.SCHEDULER_CREDITS.family(board.credits)
        yield m.HELD_TASKS.family(sum(len(session.held) for session in board.sessions))
        yield m.RECONNECT_LEASES.family(((k,), v) for k, v in sorted(streams.reconnect_leases.items()))
        yield m.ORPHANED_LEASES.family(housekeeping.orphans_put_back)
        yield m.EXECUTION_TIMEOUTS.family(((k,), v) for k, v in sorted(housekeeping.execution_timeouts.items()))

    async def read(self) -> list[Metric]:
        gauges = await self.state.gauges()
        rank = await self.queues.rank()
        classes = await self.tasks.pending_by_class()
        return [
            m.QUEUED.family(gauges.pending),
            m.LEASED.family(gauges.leased),
            m.DELAYED.family(gauges.delayed),
            m.ACTIVE_DEVICES.family(gauges.devices),
            m.OVERLOADED_DEVICES.family(gauges.overloaded),
            m.BACKOFF_DEVICES.family(gauges.backoff),
            m.DEAD_LETTERS.family(gauges.dead_letters),
            m.OLDEST_WAIT.family((rank.longest_wait_ms or 0) / 1000),
            m.PENDING.family(((enum_label(Priority, p), t), n) for p, t, n in classes),
        ]


__all__ = ["SchedulerCollector"]
