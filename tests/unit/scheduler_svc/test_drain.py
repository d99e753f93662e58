"""The scheduler's dispatch rate as published for the intake (scheduler_svc.drain.DrainMeter): over the last
second, at most every quarter second, nothing after a whole idle window, against the real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from scheduler_svc.drain import DrainMeter
from sieve.redis.queue_store import Drain, QueueStore
from sieve.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_published_rate_is_what_was_dispatched_over_the_last_second(redis: Redis, settings: Settings) -> None:
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
    # then 500 a second: what it did over the last 10 s (2 s at 2 000, 1.25 s at 500) counts for a while ...
    for _ in range(25):
        clock.now += 0.05
        dispatched[0] += 25
        await meter.tick()
    assert meter.rate_per_s == pytest.approx((4000 + 625) / 3.25, rel=0.06)  # published every 0.25 s
    # ... and once 10 s have passed at 500 a second, that is the rate
    for _ in range(220):
        clock.now += 0.05
        dispatched[0] += 25
        await meter.tick()
    assert meter.rate_per_s == pytest.approx(500.0, rel=0.02)


async def test_after_an_idle_window_the_rate_starts_afresh(redis: Redis, settings: Settings) -> None:
    queues = QueueStore(redis, settings)
    clock = Clock()
    dispatched = [0]
    meter = DrainMeter(queues, lambda: dispatched[0], replica="r2", clock=clock)
    await meter.tick()  # at start it says what it knows: nothing dispatched
    assert await queues.drain_rate(fresh_ms=3000) == Drain(0.0, int(await _published_at(queues, "r2")))
    clock.now += 60  # idle for a minute, then a burst
    dispatched[0] += 300
    await meter.tick()
    for _ in range(6):
        clock.now += 0.05
        dispatched[0] += 150
        await meter.tick()
    assert meter.rate_per_s == pytest.approx(3000.0)  # not diluted over the idle minute


async def test_a_moment_without_dispatching_does_not_drop_the_published_rate_to_it(
    redis: Redis, settings: Settings
) -> None:
    queues = QueueStore(redis, settings)
    clock = Clock()
    dispatched = [0]
    meter = DrainMeter(queues, lambda: dispatched[0], replica="r3", clock=clock)
    # 3 000 tasks a second for 5 s ...
    for _ in range(100):
        clock.now += 0.05
        dispatched[0] += 150
        await meter.tick()
    assert meter.rate_per_s == pytest.approx(3000.0)
    # ... then a second in which every worker was full and little went out
    for _ in range(20):
        clock.now += 0.05
        dispatched[0] += 2
        await meter.tick()
    # what it did over the last seconds still counts: (15 000 + 40) / 6 s, not 40 a second
    assert meter.rate_per_s == pytest.approx(15040 / 6, rel=0.06)  # published every 0.25 s


async def _published_at(queues: QueueStore, replica: str) -> int:
    return int((await queues.redis.hget(queues.keys.drain, replica) or "0|0").partition("|")[2])
