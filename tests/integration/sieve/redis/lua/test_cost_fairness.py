"""Fair by cost, end to end through the real scripts: claims by the fair order (claimDevices), acks that charge each
device what its tasks cost (CostMeter -> ackMany -> chargeDevice). A simulated worker pool on a simulated clock
runs each claimed task for its cost and acks it when done; two backlogged devices whose tasks differ 10x in cost
then share the pool's time, not its hand-outs.
"""

from __future__ import annotations

import heapq
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from scheduler_svc.cost import CostMeter
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import OCR, T0, S
from tests.support.redis import delete_prefix

DEAR, CHEAP = "DD:00:00:00:00:01", "DD:00:00:00:00:02"


@dataclass
class Pool:
    """A worker pool of `slots` on a simulated clock (ms): what it ran, per device, in worker time."""

    store: QueueStore
    meter: CostMeter
    cost_ms: dict[str, float]
    slots: int
    now: float = float(T0 + S)
    running: list[tuple[float, int, str, Entry]] = field(default_factory=list)
    worked_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: what ran once the costs are learnt (after the first 20 s)
    settled_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _n: int = 0

    async def run_until(self, end: float) -> None:
        while self.now < end:
            free = self.slots - len(self.running)
            if free:
                claim = await self.store.claim(
                    uuid.uuid4().hex, free, {OCR: free}, max_devices=free, ms_per_task=1.0, now=self.now
                )
                for mac, popped in claim.devices:
                    for entry in popped.taken:
                        self._n += 1
                        heapq.heappush(self.running, (self.now + self.cost_ms[mac], self._n, mac, entry))
                        self.worked_ms[mac] += self.cost_ms[mac]
                        if self.now >= T0 + 20 * S:
                            self.settled_ms[mac] += self.cost_ms[mac]
            done_at, _, mac, entry = heapq.heappop(self.running)  # the next task to end
            self.now = done_at
            charges = self.meter.charges([(mac, OCR, self.cost_ms[mac])])
            [acked] = await self.store.ack(
                [(entry.task_id, entry.attempt)], device_of={entry.task_id: mac}, charges=charges
            )
            assert acked

    def share(self, mac: str) -> float:
        return self.worked_ms[mac] / sum(self.worked_ms.values())

    def settled_share(self, mac: str) -> float:
        return self.settled_ms[mac] / sum(self.settled_ms.values())


async def pool_of(
    redis: Redis, settings: Settings, cost_ms: dict[str, float] | None = None, slots: int = 4, backlog: float = 1.5
) -> Pool:
    """Backlogged devices (by default two: one 1 000 ms per task, the other 100 ms) on a pool of `slots`."""
    cost_ms = cost_ms or {DEAR: 1000.0, CHEAP: 100.0}
    store = QueueStore(redis, settings.replace(max_per_device_pending=100_000, max_total_pending=100_000))
    await store.mark_rebuilt("test")
    # `backlog` x an equal share of two minutes of the pool: every device stays backlogged
    queued = {mac: int(backlog * slots * 120 * S / ms / len(cost_ms)) for mac, ms in cost_ms.items()}
    outcomes = await store.enqueue_many(
        {mac: [Entry(f"{mac[-1]}-{i}", OCR, 3, T0, T0 + 3600 * S) for i in range(n)] for mac, n in queued.items()},
        now=T0,
    )
    assert all(isinstance(o, tuple) for o in outcomes.values()), outcomes
    pool = Pool(store, CostMeter(settings), cost_ms, slots=slots)
    pool.meter = CostMeter(settings, clock=lambda: pool.now / 1000)  # it reads the pool's clock, in seconds
    return pool


async def test_two_devices_whose_tasks_differ_tenfold_share_the_pools_time(redis: Redis, settings: Settings) -> None:
    s = settings.replace(redis_prefix=f"t-cost-{uuid.uuid4().hex[:8]}")
    try:
        # Given two backlogged OCR devices, one's tasks ten times dearer
        pool = await pool_of(redis, s)
        # When the pool runs them for two simulated minutes
        await pool.run_until(T0 + 120 * S)
        # Then each had half the pool's time, within 10 % of each other
        assert min(pool.share(DEAR), pool.share(CHEAP)) / max(pool.share(DEAR), pool.share(CHEAP)) >= 0.9
    finally:
        await delete_prefix(redis, s.redis_prefix)


@pytest.mark.parametrize(
    ("cost_ms", "slots"),
    [((1000.0, 300.0, 100.0), 2), ((200.0, 2000.0), 8), ((2000.0, 200.0, 200.0, 20.0), 3)],
    ids=["three devices, 2 slots", "two, 8 slots", "four, 3 slots"],
)
async def test_devices_of_other_costs_and_pools_share_alike(
    redis: Redis, settings: Settings, cost_ms: tuple[float, ...], slots: int
) -> None:
    s = settings.replace(redis_prefix=f"t-cost-{uuid.uuid4().hex[:8]}")
    devices = {f"DD:00:00:00:01:{i:02X}": ms for i, ms in enumerate(cost_ms)}
    try:
        pool = await pool_of(redis, s, devices, slots)
        await pool.run_until(T0 + 120 * S)
        # once the costs are learnt (the first tasks are handed out by count), within 10 % of each other
        settled = [pool.settled_share(mac) for mac in devices]
        assert min(settled) / max(settled) >= 0.9, settled
        # and over the whole two minutes, the first seconds included, within 20 %
        shares = [pool.share(mac) for mac in devices]
        assert min(shares) / max(shares) >= 0.8, shares
    finally:
        await delete_prefix(redis, s.redis_prefix)


async def test_counting_hand_outs_gives_the_dear_device_ten_times_the_time(redis: Redis, settings: Settings) -> None:
    s = settings.replace(redis_prefix=f"t-cost-{uuid.uuid4().hex[:8]}", fair_by_cost_types="")
    try:
        # Given the same devices with every type counted by hand-outs
        pool = await pool_of(redis, s, backlog=3)
        await pool.run_until(T0 + 120 * S)
        # Then the dear one had most of the pool: what fair by cost corrects
        assert pool.share(DEAR) > 0.8
    finally:
        await delete_prefix(redis, s.redis_prefix)
