"""deferDevice (QueueStore.defer): tasks put back at the front in the order taken, the device backed off
exponentially (capped, reset by a successful release), skipped by rank and pop meanwhile, dead letters at max
defers, the capped dead-letter list.
"""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from sieve.errors import LockNotOwned
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import HIGH, T0, TEXT, A, B, S, entry, serve, snapshot, tasks


async def test_defer_puts_the_tasks_back_at_the_front_in_the_order_they_were_taken(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, [entry("h1", prio=HIGH), entry("n1"), entry("n2"), entry("n3")], now=T0)
    popped = await store.pop(A, "tok", 3, now=T0 + S)
    taken = [e.task_id for e in popped.taken]
    assert taken == ["h1", "n1", "n2"]
    deferred = await store.defer(A, "tok", taken, "no worker for TEXT", now=T0 + S)
    assert deferred.unschedulable_until_ms == T0 + S + 30 * S
    assert deferred.dead_letters == []
    queued = await store.queued(A)
    assert [e.task_id for e in queued] == ["h1", "n1", "n2", "n3"]
    # the defer does not count as a failure, but as a defer; the attempt number (hand-outs) stays
    assert [(e.attempt, e.defers, e.failures) for e in queued] == [(1, 1, 0), (1, 1, 0), (1, 1, 0), (0, 0, 0)]
    assert await redis.zcard(keys.leases) == 0
    assert await redis.hlen(keys.lease_data) == 0
    assert await store.pending() == 4
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"], meta["defer_reason"]) == ("backoff", "4", "no worker for TEXT")
    assert meta["unschedulable_until_ms"] == str(T0 + 31 * S)
    assert await redis.zscore(keys.backoff, A) == T0 + 31 * S
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None


async def test_the_backoff_doubles_on_successive_defers_and_is_capped(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_attempts=100))
    await store.enqueue(A, tasks("a", 3), now=T0)
    now = T0
    delays = []
    for _ in range(8):
        popped = await store.pop(A, "tok", 1, now=now)
        assert popped.ready
        deferred = await store.defer(A, "tok", [e.task_id for e in popped.taken], "no worker", now=now)
        delays.append((deferred.unschedulable_until_ms - now) // S)
        now = deferred.unschedulable_until_ms
        assert await store.resume_due(now=now) == [A]
    assert delays == [30, 60, 120, 240, 480, 600, 600, 600]


async def test_a_successful_release_resets_the_backoff_doubling(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 3), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    first = await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    await store.resume_due(now=first.unschedulable_until_ms)
    await serve(store, A, 1, first.unschedulable_until_ms)
    popped = await store.pop(A, "tok", 1, now=T0 + 100 * S)
    second = await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0 + 100 * S)
    assert second.unschedulable_until_ms == T0 + 100 * S + 30 * S


async def test_a_device_in_backoff_is_skipped_by_rank_and_pop(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2, at=T0), now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + 5 * S)], now=T0 + 5 * S)
    popped = await store.pop(A, "tok", 1, now=T0 + 10 * S)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0 + 10 * S)
    # While A backs off only B is schedulable, and rank says when A's backoff ends
    rank = await store.rank(now=T0 + 20 * S)
    assert (rank.mac, rank.next_backoff_ms) == (B, T0 + 40 * S)
    assert not (await store.pop(A, "tok2", 1, now=T0 + 20 * S)).ready
    await serve(store, B, 1, T0 + 20 * S)
    assert (await store.rank(now=T0 + 45 * S)).mac is None


async def test_defer_with_a_wrong_token_raises_and_changes_nothing(
    store: QueueStore, redis: Redis, settings: Settings
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    with pytest.raises(LockNotOwned):
        await store.defer(A, "other", [popped.taken[0].task_id], "no worker", now=T0)
    assert await snapshot(redis, settings.redis_prefix) == before


async def test_defer_of_a_device_with_nothing_left_leaves_it_idle(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    # the popped task is handed out; the dispatch defers nothing
    deferred = await store.defer(A, "tok", [], "no worker", now=T0)
    assert deferred.unschedulable_until_ms == 0
    assert (await store.device_meta(A))["state"] == "idle"
    assert await redis.zscore(keys.backoff, A) is None
    assert await store.ack([(popped.taken[0].task_id, 1)]) == [True]


async def test_a_device_that_a_defer_leaves_idle_is_no_longer_active(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [], "no worker", now=T0)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)


async def test_a_task_deferred_max_attempts_times_is_dead_lettered(store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given a task enqueued at T0 and the default max_attempts of 6
    await store.enqueue(A, [entry("a1", prio=HIGH, at=T0)], now=T0)
    now = T0
    # When it is deferred five times, it goes back each time
    for n in range(1, 6):
        popped = await store.pop(A, "tok", 1, now=now)
        deferred = await store.defer(A, "tok", ["a1"], "no worker for TEXT", now=now)
        assert deferred.dead_letters == []
        # the attempt number keeps counting hand-outs (it is the fencing token); defers count put-backs
        assert [(e.attempt, e.defers, e.failures) for e in await store.queued(A)] == [(n, n, 0)]
        now = deferred.unschedulable_until_ms
        await store.resume_due(now=now)
    # When it is deferred the sixth time
    popped = await store.pop(A, "tok", 1, now=now)
    assert popped.taken[0].defers == 5
    deferred = await store.defer(A, "tok", ["a1"], "no worker for TEXT", now=now)
    # Then it is dead-lettered with the fields an operator reads, and nothing is queued
    assert deferred.unschedulable_until_ms == 0
    assert deferred.dead_letters == [
        {
            "task_id": "a1",
            "device": A,
            "task_type": TEXT,
            "priority": HIGH,
            "error": "no worker for TEXT",
            "attempts": 0,
            "handouts": 6,
            "requeue_count": 6,
            "enqueued_ms": T0,
            "dead_ms": now,
        }
    ]
    assert [json.loads(r) for r in await redis.lrange(keys.dead_letters, 0, -1)] == deferred.dead_letters
    assert await store.queued(A) == []
    assert await store.pending() == 0
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten


async def test_the_dead_letter_list_is_capped(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_attempts=1, dead_letter_keep=2))
    await store.enqueue(A, tasks("a", 3), now=T0)
    popped = await store.pop(A, "tok", 3, now=T0)
    deferred = await store.defer(A, "tok", [e.task_id for e in popped.taken], "no worker", now=T0)
    assert len(deferred.dead_letters) == 3
    kept = [json.loads(r)["task_id"] for r in await redis.lrange(store.keys.dead_letters, 0, -1)]
    assert kept == ["a0", "a1"]  # newest first: put back from the last taken to the first
