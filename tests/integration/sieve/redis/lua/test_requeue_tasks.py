"""requeueTasks (QueueStore.requeue): leased tasks back at the front in their order, counted and uncounted
attempts, dead letters at max attempts, retry times through the delayed set; lease expiry (leases_due,
renew_leases) feeding it.
"""

from __future__ import annotations

from dataclasses import replace

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from tests.integration.sieve.redis.lua.helpers import (
    LOW,
    NORMAL,
    T0,
    TEXT,
    A,
    B,
    S,
    entry,
    ids,
    schedule_score,
    serve,
    tasks,
)


async def test_requeue_puts_tasks_at_the_front_in_their_original_order(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 5), now=T0)
    popped = await store.pop(A, "tok", 3, now=T0)
    await store.release(A, "tok", now=T0)
    result = await store.requeue(
        A, [(e.task_id, e.attempt) for e in popped.taken], count_attempt=True, reason="worker gone", now=T0 + S
    )
    assert (result.requeued, result.dead_letters) == (3, [])
    assert await ids(store, A) == ["a0", "a1", "a2", "a3", "a4"]


async def test_a_counted_requeue_counts_a_failure_and_an_uncounted_one_does_not(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="nack", now=T0)
    await store.requeue(A, [("a1", 1)], count_attempt=False, reason="over watermark", now=T0)
    assert len(popped.taken) == 2
    assert [(e.task_id, e.attempt, e.failures) for e in await store.queued(A)] == [("a1", 1, 0), ("a0", 1, 1)]


async def test_requeue_ignores_a_stale_attempt_and_takes_any_attempt_for_a_wildcard(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    result = await store.requeue(
        A, [("a0", 5), ("unknown", None), ("a1", None)], count_attempt=True, reason="x", now=T0
    )
    assert result.requeued == 1
    assert await ids(store, A) == ["a1"]
    assert await redis.zrange(keys.leases, 0, -1) == ["a0"]


async def test_requeue_makes_an_idle_device_schedulable_again(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1, at=T0), now=T0)
    await serve(store, A, 1, T0 + 10 * S)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="lease expired", now=T0 + 70 * S)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("ready", "1")
    assert await redis.sismember(keys.devices, A)
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 10 * S
    assert (await store.rank(now=T0 + 71 * S)).mac == A


async def test_a_task_whose_counted_attempts_reach_max_attempts_is_dead_lettered(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, [entry("a0", prio=LOW, at=T0)], now=T0)
    now = T0
    for attempt in range(1, 7):
        popped = await store.pop(A, "tok", 1, now=now)
        await store.release(A, "tok", now=now)
        assert popped.taken[0].attempt == attempt
        result = await store.requeue(A, [("a0", attempt)], count_attempt=True, reason="worker died", now=now + 60 * S)
        now += 61 * S
        if attempt < 6:
            assert (result.requeued, result.dead_letters) == (1, [])
    assert result.requeued == 0
    assert result.dead_letters == [
        {
            "task_id": "a0",
            "device": A,
            "task_type": TEXT,
            "priority": LOW,
            "error": "worker died",
            "attempts": 6,
            "handouts": 6,
            "requeue_count": 0,
            "enqueued_ms": T0,
            "dead_ms": now - S,
        }
    ]
    assert await redis.llen(keys.dead_letters) == 1
    assert await store.queued(A) == []
    assert await redis.zcard(keys.leases) == 0


async def test_uncounted_requeues_never_dead_letter(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    for _ in range(10):
        popped = await store.pop(A, "tok", 1, now=T0)
        await store.release(A, "tok", now=T0)
        result = await store.requeue(
            A, [("a0", popped.taken[0].attempt)], count_attempt=False, reason="over watermark", now=T0
        )
        assert (result.requeued, result.dead_letters) == (1, [])
    assert [(e.attempt, e.failures) for e in await store.queued(A)] == [(10, 0)]


async def test_requeue_to_a_device_being_served_waits_for_its_release(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await store.release(A, "tok", now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="nack", now=T0 + S)
    assert (await store.device_meta(A))["state"] == "serving"
    assert await schedule_score(redis, keys, A, NORMAL) is None
    await store.release(A, "tok", now=T0 + 2 * S)
    assert (await store.rank(now=T0 + 3 * S)).mac == A


async def test_a_requeue_with_a_retry_time_delays_the_tasks_until_promoted(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given two leased tasks and one still queued
    await store.enqueue(A, tasks("a", 3), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    # When they are requeued to retry 30 s later
    result = await store.requeue(
        A,
        [(e.task_id, e.attempt) for e in popped.taken],
        count_attempt=True,
        reason="retry later",
        retry_at_ms=T0 + 30 * S,
        now=T0 + S,
    )
    # Then they wait in the delayed set, neither queued nor leased nor pending
    assert (result.requeued, result.dead_letters) == (0, [])
    assert await ids(store, A) == ["a2"]
    assert await store.pending() == 1
    assert await redis.zcard(keys.leases) == 0
    failed = [replace(e, failures=1) for e in popped.taken]
    assert await redis.zrange(keys.delayed, 0, -1, withscores=True) == [
        (f"{A}|{failed[0].encode()}", T0 + 30 * S),
        (f"{A}|{failed[1].encode()}", T0 + 30 * S),
    ]
    # and promote_due brings them back at the front, in order, only when due
    assert await store.promote_due(now=T0 + 30 * S - 1) == 0
    assert await store.promote_due(now=T0 + 30 * S) == 2
    assert await ids(store, A) == ["a0", "a1", "a2"]
    assert [e.attempt for e in await store.queued(A)] == [1, 1, 0]
    assert await redis.zcard(keys.delayed) == 0
    assert await store.pending() == 3


async def test_a_requeue_with_a_retry_time_still_dead_letters_at_max_attempts(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await serve(store, A, 1, T0)
    result = await store.requeue(
        A, [("a0", 1)], count_attempt=True, reason="bad input", max_attempts=1, retry_at_ms=T0 + 60 * S, now=T0
    )
    assert [d["task_id"] for d in result.dead_letters] == ["a0"]
    assert await redis.zcard(keys.delayed) == 0


async def test_a_requeue_with_a_retry_time_in_the_past_is_immediate(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await serve(store, A, 1, T0)
    result = await store.requeue(A, [("a0", 1)], count_attempt=True, reason="x", retry_at_ms=T0, now=T0 + S)
    assert result.requeued == 1
    assert await redis.zcard(keys.delayed) == 0
    assert await ids(store, A) == ["a0"]


async def test_leases_due_lists_expired_leases_by_device_and_renew_pushes_them_back(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    ttl = int(store.settings.lease_ttl_s * 1000)
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.enqueue(B, tasks("b", 1), now=T0)
    await serve(store, A, 2, T0)
    await serve(store, B, 1, T0 + 10 * S)
    assert await store.leases_due(now=T0 + ttl - 1) == {}
    assert await store.leases_due(now=T0 + ttl) == {A: [("a0", 1), ("a1", 1)]}
    assert await store.leases_due(now=T0 + 10 * S + ttl) == {A: [("a0", 1), ("a1", 1)], B: [("b0", 1)]}
    # When a live worker renews a0 (and an unknown id)
    await store.renew_leases(["a0", "ghost"], now=T0 + 30 * S)
    # Then a0 is due later, and no lease is invented
    assert await redis.zscore(keys.leases, "a0") == T0 + 30 * S + ttl
    assert await redis.zscore(keys.leases, "ghost") is None
    assert await store.leases_due(now=T0 + ttl) == {A: [("a1", 1)]}
    await store.renew_leases([])


async def test_leases_due_drops_a_deadline_without_lease_data(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await redis.zadd(keys.leases, {"orphan": T0})
    assert await store.leases_due(now=T0 + S) == {}
    assert await redis.zscore(keys.leases, "orphan") is None


async def test_expired_leases_go_back_through_requeue(store: QueueStore) -> None:
    ttl = int(store.settings.lease_ttl_s * 1000)
    await store.enqueue(A, tasks("a", 3), now=T0)
    await serve(store, A, 2, T0)
    due = await store.leases_due(now=T0 + ttl)
    for mac, leases in due.items():
        await store.requeue(mac, list(leases), count_attempt=True, reason="lease expired", now=T0 + ttl)
    assert [(e.task_id, e.attempt) for e in await store.queued(A)] == [("a0", 1), ("a1", 1), ("a2", 0)]
    assert await store.leases_due(now=T0 + 2 * ttl) == {}
