"""popBatch (QueueStore.pop): the claim (lock, serving set), priority and aging order, expired
entries dropped, leases and attempts, allowed task types, release in the same step, concurrent claims.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from sieve.errors import LockNotOwned
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from tests.integration.sieve.redis.lua.helpers import (
    BACKGROUND,
    CRITICAL,
    HIGH,
    LOW,
    NORMAL,
    OCR,
    T0,
    TEXT,
    A,
    S,
    entry,
    ids,
    schedule_score,
    tasks,
)


async def test_pop_takes_the_lock_and_a_second_pop_with_another_token_is_not_ready(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 4), now=T0)
    first = await store.pop(A, "tok-1", 2, now=T0 + S)
    assert first.ready and len(first.taken) == 2
    assert await redis.get(keys.lock(A)) == "tok-1"
    assert 0 < await redis.pttl(keys.lock(A)) <= 900 * S
    # When another replica tries the same device
    second = await store.pop(A, "tok-2", 2, now=T0 + S)
    # Then it gets nothing and the lock stays with the first
    assert not second.ready and second.taken == []
    assert await redis.get(keys.lock(A)) == "tok-1"
    assert await ids(store, A) == ["a2", "a3"]


async def test_pop_moves_the_device_from_its_schedule_set_to_serving(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert await redis.zscore(keys.serving, A) == T0 + S + 900 * S
    meta = await store.device_meta(A)
    assert (meta["state"], meta["class"], meta["token"], meta["last_served_ms"]) == ("serving", "0", "tok", str(T0 + S))
    assert (await store.rank(now=T0 + 2 * S)).mac is None


async def test_pop_of_a_device_whose_meta_was_lost_takes_it_out_of_the_schedule_sets(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given a device whose meta was deleted behind Sieve's back while it sat in a schedule set
    await store.enqueue(A, tasks("a", 2), now=T0)
    await redis.delete(keys.meta(A))
    assert (await store.rank(now=T0 + S)).mac == A
    # When it is popped, Then it is not ready and the rank no longer offers it (no dispatch spin on a ghost)
    assert not (await store.pop(A, "tok", 1, now=T0 + S)).ready
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert (await store.rank(now=T0 + 2 * S)).mac is None
    assert await redis.get(keys.lock(A)) is None
    # (the lost meta leaves the counters disagreeing: the reconciler's repair, not this test's subject)
    await redis.delete(*(keys.queue(A, prio) for prio in range(1, 6)), keys.caller_open)
    await redis.set(keys.pending, 0)


async def test_pop_of_a_device_without_work_is_not_ready_and_leaves_no_lock(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    popped = await store.pop(A, "tok", 5, now=T0)
    assert not popped.ready
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None


async def test_pop_takes_the_highest_priority_first_and_fifo_within_it(store: QueueStore) -> None:
    await store.enqueue(
        A,
        [
            entry("n1", prio=NORMAL, at=T0),
            entry("l1", prio=LOW, at=T0),
            entry("c1", prio=CRITICAL, at=T0 + S),
            entry("n2", prio=NORMAL, at=T0 + S),
            entry("c2", prio=CRITICAL, at=T0 + 2 * S),
        ],
        now=T0 + 2 * S,
    )
    popped = await store.pop(A, "tok", 4, now=T0 + 3 * S)
    assert [e.task_id for e in popped.taken] == ["c1", "c2", "n1", "n2"]
    assert await ids(store, A) == ["l1"]


async def test_pop_takes_an_aged_low_priority_head_before_younger_high_priority_tasks(store: QueueStore) -> None:
    # Given a BACKGROUND task queued at T0 and HIGH tasks queued 500 s later
    await store.enqueue(A, [entry("bg", prio=BACKGROUND, at=T0)], now=T0)
    await store.enqueue(
        A, [entry("h1", prio=HIGH, at=T0 + 500 * S), entry("h2", prio=HIGH, at=T0 + 500 * S)], now=T0 + 500 * S
    )
    # When the device is popped after the BACKGROUND task waited max_wait
    popped = await store.pop(A, "tok", 3, now=T0 + 600 * S)
    # Then the aged head goes first, then the high priority ones
    assert [e.task_id for e in popped.taken] == ["bg", "h1", "h2"]


async def test_pop_before_max_wait_keeps_strict_priority(store: QueueStore) -> None:
    await store.enqueue(A, [entry("bg", prio=BACKGROUND, at=T0)], now=T0)
    await store.enqueue(A, [entry("h1", prio=HIGH, at=T0 + 500 * S)], now=T0 + 500 * S)
    popped = await store.pop(A, "tok", 2, now=T0 + 600 * S - 1)
    assert [e.task_id for e in popped.taken] == ["h1", "bg"]


async def test_among_several_aged_heads_pop_takes_the_oldest_first(store: QueueStore) -> None:
    await store.enqueue(
        A,
        [
            entry("low", prio=LOW, at=T0 + 10 * S),
            entry("bg", prio=BACKGROUND, at=T0),
            entry("crit", prio=CRITICAL, at=T0 + 700 * S),
        ],
        now=T0 + 700 * S,
    )
    popped = await store.pop(A, "tok", 3, now=T0 + 800 * S)
    assert [e.task_id for e in popped.taken] == ["bg", "low", "crit"]


async def test_pop_drops_expired_entries_and_counts_them_out(store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given two expired tasks among live ones
    await store.enqueue(
        A,
        [
            entry("x1", at=T0, ttl_ms=10 * S),
            entry("ok1", at=T0),
            entry("x2", prio=HIGH, at=T0, ttl_ms=10 * S),
            entry("ok2", at=T0),
        ],
        now=T0,
    )
    # When 2 are popped after the short TTL
    popped = await store.pop(A, "tok", 2, now=T0 + 10 * S)
    # Then the expired ones are dropped and reported, and the 2 taken are live ones
    assert [e.task_id for e in popped.taken] == ["ok1", "ok2"]
    assert sorted(e.task_id for e in popped.expired) == ["x1", "x2"]
    assert all(e.attempt == 0 for e in popped.expired)
    assert await store.pending() == 0
    assert (await store.device_meta(A))["backlog"] == "0"
    assert await redis.hexists(keys.lease_data, "x1") is False
    assert await redis.zscore(keys.leases, "x2") is None


async def test_a_pop_that_finds_only_expired_entries_takes_nothing(store: QueueStore) -> None:
    await store.enqueue(A, [entry("x1", ttl_ms=S), entry("x2", ttl_ms=S)], now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + 2 * S)
    assert popped.ready
    assert popped.taken == []
    assert [e.task_id for e in popped.expired] == ["x1", "x2"]
    await store.release(A, "tok", now=T0 + 2 * S)
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten


async def test_pop_raises_the_attempt_and_records_the_leases(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, [entry("a1"), entry("a2", attempt=2, defers=1)], now=T0)
    popped = await store.pop(A, "tok", 5, now=T0 + S)
    assert [(e.task_id, e.attempt, e.defers) for e in popped.taken] == [("a1", 1, 0), ("a2", 3, 1)]
    lease_until = T0 + S + int(store.settings.lease_ttl_s * 1000)
    assert await redis.zrange(keys.leases, 0, -1, withscores=True) == [("a1", lease_until), ("a2", lease_until)]
    assert await redis.hget(keys.lease_data, "a1") == f"{A}|{popped.taken[0].encode()}"
    assert await redis.hget(keys.lease_data, "a2") == f"{A}|{popped.taken[1].encode()}"
    meta = await store.device_meta(A)
    assert meta["served"] == "2"
    assert meta["backlog"] == "0"


async def test_pop_takes_at_most_the_count_asked_for(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 5), now=T0)
    popped = await store.pop(A, "tok", 3, now=T0 + S)
    assert [e.task_id for e in popped.taken] == ["a0", "a1", "a2"]
    assert await store.pending() == 2
    assert (await store.device_meta(A))["backlog"] == "2"


async def test_pop_of_allowed_types_stops_before_a_task_of_another_type(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given TEXT, OCR, TEXT in one queue
    await store.enqueue(A, [entry("t1"), entry("o1", task_type=OCR), entry("t2")], now=T0)
    # When only TEXT can be served
    popped = await store.pop(A, "tok", 3, allowed_types=[TEXT], now=T0 + S)
    # Then popping stops at the OCR task, which stays at the front
    assert popped.ready and popped.blocked
    assert [e.task_id for e in popped.taken] == ["t1"]
    assert await ids(store, A) == ["o1", "t2"]
    assert await store.pending() == 2
    await store.release(A, "tok", now=T0 + S)


async def test_pop_of_allowed_types_takes_every_allowed_type_without_blocking(store: QueueStore) -> None:
    await store.enqueue(A, [entry("t1"), entry("o1", task_type=OCR)], now=T0)
    popped = await store.pop(A, "tok", 5, allowed_types=[OCR, TEXT], now=T0 + S)
    assert [e.task_id for e in popped.taken] == ["t1", "o1"]
    assert not popped.blocked
    await store.release(A, "tok", now=T0 + S)


async def test_pop_of_allowed_types_still_drops_an_expired_task_of_another_type(store: QueueStore) -> None:
    await store.enqueue(A, [entry("o1", task_type=OCR, ttl_ms=S), entry("t1")], now=T0)
    popped = await store.pop(A, "tok", 5, allowed_types=[TEXT], now=T0 + 2 * S)
    assert [e.task_id for e in popped.expired] == ["o1"]
    assert [e.task_id for e in popped.taken] == ["t1"]
    assert not popped.blocked
    await store.release(A, "tok", now=T0 + 2 * S)


async def test_pop_with_no_allowed_type_takes_nothing(store: QueueStore) -> None:
    await store.enqueue(A, [entry("t1")], now=T0)
    popped = await store.pop(A, "tok", 5, allowed_types=[], release=True, now=T0 + S)
    assert popped.taken == []
    assert await ids(store, A) == ["t1"]


async def test_pop_with_release_ends_the_dispatch_in_the_same_step(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    popped = await store.pop(A, "tok", 1, release=True, now=T0 + 50 * S)
    assert [e.task_id for e in popped.taken] == ["a0"]
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None
    meta = await store.device_meta(A)
    assert (meta["state"], meta["since_ms"]) == ("ready", str(T0 + 50 * S))
    assert "token" not in meta
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 50 * S
    # the token is gone with the lock: a later release by it is refused
    with pytest.raises(LockNotOwned):
        await store.release(A, "tok", now=T0 + 51 * S)


async def test_pop_with_release_of_the_last_tasks_leaves_the_device_idle(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 5, release=True, now=T0 + S)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)


async def test_concurrent_pops_of_one_device_hand_out_each_task_once(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 20), now=T0)
    results = await asyncio.gather(*(store.pop(A, f"tok-{i}", 5, now=T0) for i in range(8)))
    winners = [r for r in results if r.ready]
    assert len(winners) == 1
    assert [e.task_id for e in winners[0].taken] == [f"a{i}" for i in range(5)]
