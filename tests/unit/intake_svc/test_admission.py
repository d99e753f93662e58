"""The delay a refused caller is told to wait: a device's from its own backlog and service rate, a global
refusal's from the queues' measured drain rate (jittered, bounded by the configured maximum)."""

from __future__ import annotations

import random
import statistics

from redis.asyncio import Redis

from intake_svc.admission import RetryAdvisor, device_retry_after_s, global_retry_after_s
from sieve.errors import AdmissionRefused, ScriptCode
from sieve.redis.entry import Entry
from sieve.redis.queue_store import Drain, QueueStore, now_ms
from sieve.settings import Settings

SETTINGS = Settings(max_per_device_pending=200, retry_after_s=30, aging_max_wait_s=600)
NOW = 1_000_000


def test_a_device_served_at_ten_tasks_a_second_waits_for_its_excess_to_drain() -> None:
    # 200 queued, 10 more asked for: 10 must drain first, at 10/s
    meta = {"backlog": "200", "rate_per_s": "10"}
    assert device_retry_after_s(meta, 10, SETTINGS, NOW) == 1.0
    meta = {"backlog": "200", "rate_per_s": "2"}
    assert device_retry_after_s(meta, 20, SETTINGS, NOW) == 10.0


def test_the_current_window_counts_when_it_is_faster_than_the_last_one() -> None:
    meta = {"backlog": "200", "rate_per_s": "1", "win_start_ms": str(NOW - 2000), "win_count": "40"}
    assert device_retry_after_s(meta, 40, SETTINGS, NOW) == 2.0  # 20/s now


def test_a_window_start_with_a_fraction_of_a_millisecond_is_read() -> None:
    # the claim scripts store the time they were given: now_ms() has a tenth of a millisecond
    meta = {"backlog": "200", "rate_per_s": "1", "win_start_ms": f"{NOW - 2000 + 0.4}", "win_count": "40"}
    assert device_retry_after_s(meta, 40, SETTINGS, NOW) == 2.0


def test_the_delay_is_never_below_one_second_nor_above_max_wait() -> None:
    assert device_retry_after_s({"backlog": "200", "rate_per_s": "1000"}, 1, SETTINGS, NOW) == 1.0
    assert device_retry_after_s({"backlog": "200", "rate_per_s": "0.01"}, 50, SETTINGS, NOW) == 600.0


def test_a_device_served_for_less_than_a_second_is_counted_at_its_rate_so_far() -> None:
    # 10 tasks in its first 0.1 s count as 10 in 0.25 s (40/s): 40 to drain take 1 s, not the 30 s maximum
    meta = {"backlog": "200", "win_start_ms": str(NOW - 100), "win_count": "10"}
    assert device_retry_after_s(meta, 40, SETTINGS, NOW) == 1.0
    meta = {"backlog": "200", "win_start_ms": str(NOW - 100), "win_count": "1"}
    assert device_retry_after_s(meta, 40, SETTINGS, NOW) == 10.0  # 4/s so far


def test_a_device_never_served_is_counted_at_its_fair_share_of_the_drain_else_asked_back_in_a_second() -> None:
    # 100 to drain at a share of 20/s: 5 s; nothing measured: 1 s, never the configured 30 s
    assert device_retry_after_s({"backlog": "200"}, 100, SETTINGS, NOW, fair_rate_per_s=20.0) == 5.0
    assert device_retry_after_s({"backlog": "200"}, 1, SETTINGS, NOW) == 1.0


# --- global refusals: from the measured drain rate ------------------------------------------------
GLOBAL = Settings(max_total_pending=5000, retry_after_s=30)
T = 1_700_000_000_000.0


def draining(rate: float) -> Drain:
    return Drain(rate, int(T))


def test_a_global_refusal_says_when_the_room_for_the_request_drains_free() -> None:
    # Given 5 000 pending, a request of 500 and queues draining at 2 500 tasks/s
    rng = random.Random(7)
    delays = [global_retry_after_s(5000, 500, draining(2500.0), GLOBAL, rng) for _ in range(200)]

    # Then the delay is about 500 / 2 500 = 0.2 s, jittered by +-15 %, not the 30 s maximum (retry_after_s)
    assert all(0.2 * 0.85 <= d <= 0.2 * 1.15 for d in delays)
    assert len({round(d, 4) for d in delays}) > 100  # spread: refused clients do not come back together
    assert 0.19 < statistics.mean(delays) < 0.21


def test_a_slower_drain_or_a_larger_request_waits_longer_and_never_past_the_maximum() -> None:
    rng = random.Random(1)
    assert 0.85 * 4 <= global_retry_after_s(5000, 400, draining(100.0), GLOBAL, rng) <= 1.15 * 4
    assert 0.85 * 10 <= global_retry_after_s(5200, 800, draining(100.0), GLOBAL, rng) <= 1.15 * 10
    assert global_retry_after_s(5000, 500, draining(1.0), GLOBAL, rng) == 30.0
    # a drain this fast still gets a small positive delay
    assert global_retry_after_s(5000, 1, draining(1e9), GLOBAL, rng) == 0.1


def test_a_pause_in_draining_is_expected_to_last_about_as_long_again() -> None:
    rng = random.Random(3)
    # the last dispatch was 4 s ago: about 4 s; 0.2 s ago: at least a second; 10 minutes ago: the maximum
    assert 4 * 0.85 <= global_retry_after_s(5000, 10, Drain(None, int(T - 4000)), GLOBAL, rng, T) <= 4 * 1.15
    assert 0.85 <= global_retry_after_s(5000, 10, Drain(None, int(T - 200)), GLOBAL, rng, T) <= 1.15
    assert global_retry_after_s(5000, 10, Drain(None, int(T - 600_000)), GLOBAL, rng, T) == 30.0


def test_when_no_drain_was_ever_measured_the_client_comes_back_soon() -> None:
    # a fresh installation whose first tasks fill the limit before the scheduler published anything
    rng = random.Random(3)
    delays = [global_retry_after_s(5000, 10, Drain(None, None), GLOBAL, rng) for _ in range(100)]
    assert all(0.85 <= d <= 1.15 for d in delays)
    assert max(delays) - min(delays) > 0.1


async def test_the_advisor_reads_the_drain_rate_the_schedulers_publish(redis: Redis, settings: Settings) -> None:
    # Given two scheduler replicas that published their dispatch rates, and a third long ago
    queues = QueueStore(redis, settings)
    now = now_ms()
    await queues.publish_drain("replica-a", 1500.0, now=now)
    await queues.publish_drain("replica-b", 1000.0, now=now - 500)
    await queues.publish_drain("replica-c", 9000.0, now=now - 60_000)
    advisor = RetryAdvisor(queues, settings.replace(max_total_pending=5000), rng=random.Random(5))

    # Then the fresh ones count, summed, and a global refusal's delay follows from them
    assert await advisor.drain() == Drain(2500.0, int(now))
    delay = await advisor.after_s(AdmissionRefused(ScriptCode.GLOBAL_LIMIT, 0, 5000), {}, 500)
    assert 0.2 * 0.85 <= delay <= 0.2 * 1.15

    # And with nothing fresh, nothing drains now, and it is known since when
    assert await queues.drain_rate(fresh_ms=3000, now=now + 10_000) == Drain(None, int(now))


async def test_a_device_never_served_is_told_its_share_of_the_drain_by_the_advisor(
    redis: Redis, settings: Settings
) -> None:
    # Given queues draining at 1 000 tasks/s over 10 active devices, and a device never served yet 50 over its limit
    queues = QueueStore(redis, settings.replace(max_per_device_pending=100))
    await queues.enqueue_many(
        {f"AA:BB:CC:00:00:{d:02X}": [Entry(f"t{d}", 1, 3, now_ms(), now_ms() + 10**7)] for d in range(10)}
    )
    await queues.publish_drain("replica-a", 1000.0, now=now_ms())
    advisor = RetryAdvisor(queues, settings.replace(max_per_device_pending=100))
    # When it is refused: 50 at its share of 100/s is half a second, at least 1 s
    refusal = AdmissionRefused(ScriptCode.DEVICE_LIMIT, 100, 10)
    assert await advisor.after_s(refusal, {"backlog": "100"}, 50) == 1.0
    # And 500 over its limit take 5 s at that share, not the 30 s of the configured maximum
    assert await advisor.after_s(refusal, {"backlog": "100"}, 500) == 5.0
