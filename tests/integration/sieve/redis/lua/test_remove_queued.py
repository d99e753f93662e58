"""removeQueued (QueueStore.cancel, remove_queued): a queued task leaves with exact counters and a rescheduled or
idle device; leased or unknown tasks are not touched.
"""

from __future__ import annotations

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import (
    HIGH,
    NORMAL,
    T0,
    A,
    B,
    S,
    entry,
    ids,
    schedule_score,
    snapshot,
    tasks,
)


async def test_cancel_removes_a_queued_task_and_keeps_the_counters_exact(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, [entry("a0", at=T0), entry("a1", at=T0 + S), entry("h0", prio=HIGH, at=T0 + S)], now=T0 + S)
    await store.enqueue(B, [entry("b0")], now=T0 + S)
    assert await store.cancel(A, "a0", now=T0 + 2 * S)
    assert await ids(store, A) == ["h0", "a1"]
    assert await store.pending() == 3
    assert (await store.device_meta(A))["backlog"] == "2"
    # the oldest task went, so the device's wait now starts at the next oldest
    assert await schedule_score(redis, keys, A, HIGH) == T0 + S
    assert await store.cancel(A, "h0", now=T0 + 2 * S)
    assert await schedule_score(redis, keys, A, HIGH) is None
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + S


async def test_cancelling_the_last_task_makes_the_device_idle(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, [entry("a0")], now=T0)
    assert await store.cancel(A, "a0", now=T0 + S)
    meta = await store.device_meta(A)
    assert meta == {}  # idle, nothing outstanding: its meta is forgotten
    assert not await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + 2 * S)).mac is None


async def test_cancel_of_a_leased_or_unknown_task_returns_false_and_changes_nothing(
    store: QueueStore, redis: Redis, settings: Settings
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await store.release(A, "tok", now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    assert await store.cancel(A, "a0", now=T0 + S) is False
    assert await store.cancel(A, "zzz", now=T0 + S) is False
    assert await store.cancel(B, "a1", now=T0 + S) is False
    assert await snapshot(redis, settings.redis_prefix) == before


async def test_remove_queued_returns_the_removed_entry(store: QueueStore) -> None:
    queued = entry("a0", prio=HIGH, ttl_ms=10 * S)
    await store.enqueue(A, [queued, entry("a1")], now=T0)
    assert await store.remove_queued(A, "a0", now=T0 + 20 * S) == queued
    assert await store.remove_queued(A, "a0", now=T0 + 20 * S) is None
    assert await ids(store, A) == ["a1"]


async def test_cancel_matches_the_whole_task_id(store: QueueStore) -> None:
    await store.enqueue(A, [entry("task-10"), entry("task-1")], now=T0)
    assert await store.cancel(A, "task-1", now=T0)
    assert await ids(store, A) == ["task-10"]


async def test_cancel_in_a_device_in_backoff_keeps_it_in_backoff(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    assert await store.cancel(A, "a0", now=T0 + S)
    assert await store.cancel(A, "a1", now=T0 + S)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("backoff", "0")
    # its resume finds nothing left
    assert await store.resume_due(now=T0 + 30 * S) == [A]
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten
