"""deferTypes against the real Redis (through QueueStore.defer_types): tasks of a type nobody can run wait in the
delayed set on their own — the ones taken in this dispatch and every queued one of that type — each for
base x 2^(defers-1), capped, dead-lettered at max defers; the device is released and stays schedulable for its
other types; counters stay exact (pending == queue lengths == backlogs)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from sieve.errors import LockNotOwned
from sieve.redis.entry import Entry
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import OCR, T0, TEXT, A, B, S, entry


@pytest.fixture
def store(redis: Redis, settings: Settings) -> QueueStore:
    """The package's store, with a per-device pending limit of 4 (the lua conftest checks the counters)."""
    return QueueStore(redis, settings.replace(max_per_device_pending=4))


async def delayed(redis: Redis, keys: Keys) -> dict[str, tuple[Entry, float]]:
    return {
        Entry.decode(m.partition("|")[2]).task_id: (Entry.decode(m.partition("|")[2]), due)
        for m, due in await redis.zrange(keys.delayed, 0, -1, withscores=True)
    }


async def test_a_type_nobody_runs_waits_alone_and_the_devices_other_types_stay_schedulable(
    store: QueueStore, redis: Redis
) -> None:
    keys = store.keys
    # Given a device with an image first, then texts and more images
    await store.enqueue(A, [entry("i1", task_type=OCR), entry("t1"), entry("i2", task_type=OCR), entry("t2")], now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + S)
    assert [e.task_id for e in popped.taken] == ["i1"]

    # When its images are deferred
    out = await store.defer_types(A, "tok", ["i1"], [OCR], "no GPU worker alive (strategy defer)", now=T0 + S)

    # Then both images wait 30 s (the taken one and the queued one), the texts stay queued in order
    assert sorted(out.waiting) == ["i1", "i2"] and out.dead_letters == []
    assert out.earliest_due_ms == T0 + 31 * S
    waiting = await delayed(redis, keys)
    assert {t: (e.defers, due) for t, (e, due) in waiting.items()} == {"i1": (1, T0 + 31 * S), "i2": (1, T0 + 31 * S)}
    assert [e.task_id for e in await store.queued(A)] == ["t1", "t2"]
    assert await store.pending() == 2
    # and the device is released and ready for its texts at once (no backoff, no lock, no lease)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("ready", "2")
    assert await redis.zscore(keys.backoff, A) is None
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zcard(keys.leases) == 0
    assert (await store.rank(now=T0 + 2 * S)).mac == A
    texts = await store.pop(A, "t2", 5, allowed_types=[TEXT], release=True, now=T0 + 2 * S)
    assert [e.task_id for e in texts.taken] == ["t1", "t2"]

    # And when they are due, they come back to the front of the device's queue
    assert await store.promote_due(now=T0 + 31 * S) == 2
    assert [e.task_id for e in await store.queued(A)] == ["i1", "i2"]


async def test_each_task_waits_by_its_own_defers_doubling_to_the_cap_then_is_dead_lettered(
    redis: Redis, settings: Settings
) -> None:
    store = QueueStore(redis, settings.replace(max_attempts=5, defer_backoff_base_s=2, defer_backoff_max_s=10))
    await store.enqueue(A, [entry("i1", task_type=OCR, defers=2), entry("i2", task_type=OCR)], now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    out = await store.defer_types(A, "tok", [e.task_id for e in popped.taken], [OCR], "nobody", now=T0)
    waiting = await delayed(redis, store.keys)
    # i1 (third defer): 2 x 2^2 = 8 s; i2 (first): 2 s
    assert {t: due - T0 for t, (_, due) in waiting.items()} == {"i1": 8 * S, "i2": 2 * S}
    assert out.earliest_due_ms == T0 + 2 * S
    # a task deferred max_attempts times is dead-lettered instead of waiting again
    now = T0 + 10 * S
    dead: list[dict[str, object]] = []
    for _ in range(2):
        assert await store.promote_due(now=now) == 2
        popped = await store.pop(A, "tok", 1, now=now)
        out = await store.defer_types(A, "tok", [e.task_id for e in popped.taken], [OCR], "nobody", now=now)
        dead += out.dead_letters
        now += 20 * S
    assert [d["task_id"] for d in dead] == ["i1"]
    assert dead[0]["requeue_count"] == 5 and dead[0]["error"] == "nobody"
    assert {t: e.defers for t, (e, _) in (await delayed(redis, store.keys)).items()} == {"i2": 3}
    await redis.delete(store.keys.delayed)


async def test_deferring_clears_the_overloaded_mark_below_the_limit_and_an_emptied_device_goes_idle(
    store: QueueStore, redis: Redis
) -> None:
    keys = store.keys
    await store.enqueue(A, [entry(f"i{i}", task_type=OCR) for i in range(4)], now=T0)
    await store.mark_overloaded(A)
    popped = await store.pop(A, "tok", 1, now=T0)
    out = await store.defer_types(A, "tok", [popped.taken[0].task_id], [OCR], "nobody", now=T0)
    assert len(out.waiting) == 4
    assert not await redis.sismember(keys.overloaded, A)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + S)).mac is None


async def test_a_defer_with_a_wrong_token_changes_nothing(store: QueueStore, redis: Redis) -> None:
    await store.enqueue(B, [entry("i1", task_type=OCR), entry("t1")], now=T0)
    popped = await store.pop(B, "tok", 1, now=T0)
    with pytest.raises(LockNotOwned):
        await store.defer_types(B, "other", [popped.taken[0].task_id], [OCR], "nobody", now=T0)
    assert await redis.zcard(store.keys.delayed) == 0
    assert [e.task_id for e in await store.queued(B)] == ["t1"]
    await store.defer_types(B, "tok", [popped.taken[0].task_id], [OCR], "nobody", now=T0)  # leaves it clean


async def test_expired_tasks_of_the_type_stay_queued_for_the_pop_to_drop(store: QueueStore, redis: Redis) -> None:
    await store.enqueue(A, [entry("t1"), entry("old", task_type=OCR, ttl_ms=5 * S)], now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + 10 * S)
    assert [e.task_id for e in popped.taken] == ["t1"]
    out = await store.defer_types(A, "tok", [], [OCR], "nobody", now=T0 + 10 * S)
    assert out.waiting == []
    later = await store.pop(A, "tok2", 5, release=True, now=T0 + 11 * S)
    assert [e.task_id for e in later.expired] == ["old"]
    await store.ack([("t1", popped.taken[0].attempt)])
