"""The scheduler's dispatch rate as published for the intake (scheduler_svc.drain.DrainMeter): over the last
second, at most every quarter second, nothing after a whole idle window, against the real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from scheduler_svc.drain import DrainMeter
from sieve.queue_store import QueueStore
from sieve.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_published_rate_is_what_was_dispatched_over_the_last_second(
        redis: Redis, settings: Settings) -> None:
    queues = QueueStore(redis, settings)
    clock = Clock()
    dispatched = [0]
    meter = DrainMeter(queues, lambda: dispatched[0], replica="r1", clock=clock)
    # 2 000 tasks a second for 2 s, ticking every 50 ms
    for _ in range(40):
        clock.now += 0.05
        dispatched[0] += 100
        await meter.tick()
    assert meter.rate_per_s == pytest.approx(2000.0)
    rate = (await queues.drain_rate(fresh_ms=3000)).rate_per_s
    assert rate == pytest.approx(2000.0, abs=0.01)
    # then 500 a second: within a second the published rate follows
    for _ in range(25):
        clock.now += 0.05
        dispatched[0] += 25
        await meter.tick()
    assert meter.rate_per_s == pytest.approx(500.0)


async def test_after_an_idle_window_the_rate_starts_afresh(redis: Redis, settings: Settings) -> None:
    queues = QueueStore(redis, settings)
    clock = Clock()
    dispatched = [0]
    meter = DrainMeter(queues, lambda: dispatched[0], replica="r2", clock=clock)
    clock.now += 60  # idle for a minute, then a burst
    dispatched[0] += 300
    await meter.tick()
    assert meter.rate_per_s == 0.0  # nothing published yet: too little history
    for _ in range(4):
        clock.now += 0.05
        dispatched[0] += 150
        await meter.tick()
    assert meter.rate_per_s == pytest.approx(3000.0)  # not diluted over the idle minute
