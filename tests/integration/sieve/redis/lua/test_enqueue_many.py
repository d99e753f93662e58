"""enqueueMany (QueueStore.enqueue, enqueue_many): queues, backlog, global counter and schedule set move
together; the wake channel; admission refusals (global, device, caller limits) change nothing but the overloaded
mark.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from sieve.errors import AdmissionRefused, ScriptCode
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import (
    CRITICAL,
    HIGH,
    NORMAL,
    T0,
    A,
    B,
    C,
    S,
    entry,
    ids,
    schedule_score,
    snapshot,
    tasks,
)


async def test_enqueue_updates_queue_backlog_global_counter_and_schedule_set(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given an empty installation
    # When a device enqueues a NORMAL and a HIGH task
    backlog, pending = await store.enqueue(
        A, [entry("n1", prio=NORMAL, at=T0), entry("h1", prio=HIGH, at=T0 + 5 * S)], now=T0 + 5 * S
    )
    # Then counters, queues and the device's schedule set agree
    assert (backlog, pending) == (2, 2)
    assert await store.pending() == 2
    assert await redis.lrange(keys.queue(A, NORMAL), 0, -1) == [entry("n1").encode()]
    assert await redis.lrange(keys.queue(A, HIGH), 0, -1) == [entry("h1", prio=HIGH, at=T0 + 5 * S).encode()]
    meta = await store.device_meta(A)
    assert meta["backlog"] == "2"
    assert meta["state"] == "ready"
    assert meta["class"] == str(HIGH)
    assert meta["oldest_ms"] == str(T0)
    assert meta["weight"] == "1"
    assert meta["device"] == A
    # the device sits in the schedule set of its best priority only, scored by its oldest task
    assert await schedule_score(redis, keys, A, HIGH) == T0
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert await redis.sismember(keys.devices, A)


async def test_an_enqueued_device_becomes_schedulable(store: QueueStore) -> None:
    assert (await store.rank(now=T0)).mac is None
    await store.enqueue(A, [entry("t1")], now=T0)
    assert (await store.rank(now=T0 + S)).mac == A


async def test_enqueue_adds_to_the_back_of_the_queue(store: QueueStore) -> None:
    await store.enqueue(A, [entry("t1"), entry("t2")], now=T0)
    backlog, pending = await store.enqueue(A, [entry("t3", at=T0 + S)], now=T0 + S)
    assert (backlog, pending) == (3, 3)
    assert await ids(store, A) == ["t1", "t2", "t3"]


async def test_a_higher_priority_task_moves_a_ready_device_to_the_higher_class(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, [entry("n1")], now=T0)
    await store.enqueue(A, [entry("c1", prio=CRITICAL, at=T0 + S)], now=T0 + S)
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert await schedule_score(redis, keys, A, CRITICAL) == T0
    assert (await store.device_meta(A))["class"] == str(CRITICAL)


async def test_enqueue_publishes_on_the_wake_channel_only_when_the_device_becomes_schedulable(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.wake_channel)
    try:
        confirm = await pubsub.get_message(timeout=1.0)
        assert confirm is not None and confirm["type"] == "subscribe"
        # When an idle device enqueues
        await store.enqueue(A, [entry("t1")], now=T0)
        # Then its MAC is published
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        assert message is not None
        assert (message["channel"], message["data"]) == (keys.wake_channel, A)
        # When the device, already schedulable, enqueues again
        await store.enqueue(A, [entry("t2")], now=T0)
        # Then nothing more is published
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3) is None
    finally:
        await pubsub.unsubscribe()
        await pubsub.aclose()


async def test_enqueue_to_a_device_being_served_does_not_reschedule_it(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, [entry("t1")], now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await store.enqueue(A, [entry("t2", at=T0 + 2 * S)], now=T0 + 2 * S)
    assert (await store.device_meta(A))["state"] == "serving"
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert (await store.rank(now=T0 + 3 * S)).mac is None
    await store.release(A, "tok", now=T0 + 3 * S)
    assert (await store.rank(now=T0 + 4 * S)).mac == A


async def test_a_global_limit_refusal_changes_nothing(redis: Redis, settings: Settings) -> None:
    # Given a global limit of 3 with 2 tasks pending
    store = QueueStore(redis, settings.replace(max_total_pending=3))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    # When another device asks for 2 more
    with pytest.raises(AdmissionRefused) as refused:
        await store.enqueue(B, [entry("b1"), entry("b2")], now=T0 + S)
    # Then it is refused globally, reporting the state it saw, and no key changed
    assert refused.value.code is ScriptCode.GLOBAL_LIMIT
    assert refused.value.is_global
    assert (refused.value.backlog, refused.value.pending) == (0, 2)
    assert await snapshot(redis, settings.redis_prefix) == before
    assert not await redis.sismember(store.keys.overloaded, B)
    # and exactly the limit is still accepted
    assert await store.enqueue(B, [entry("b1")], now=T0 + S) == (1, 3)


async def test_a_device_limit_refusal_changes_no_queue_or_counter_and_marks_the_device_overloaded(
    redis: Redis, settings: Settings
) -> None:
    # Given a device at its limit of 2
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    # When it asks for one more
    with pytest.raises(AdmissionRefused) as refused:
        await store.enqueue(A, [entry("a3")], now=T0 + S)
    # Then only that device is refused, and only the overloaded marks changed
    assert refused.value.code is ScriptCode.DEVICE_LIMIT
    assert not refused.value.is_global
    assert (refused.value.backlog, refused.value.pending) == (2, 2)
    after = await snapshot(redis, settings.redis_prefix)
    meta_key, overloaded_key = store.keys.meta(A), store.keys.overloaded
    assert after[overloaded_key] == ("set", [A])
    del after[overloaded_key]
    after[meta_key][1].pop("overloaded", None)  # the meta hash may mirror the mark
    assert after == before
    # and another device is still accepted
    assert await store.enqueue(B, [entry("b1")], now=T0 + S) == (1, 3)


async def test_a_batch_larger_than_the_device_limit_is_refused_whole(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    with pytest.raises(AdmissionRefused):
        await store.enqueue(A, tasks("a", 3), now=T0)
    assert await store.queued(A) == []
    assert await store.pending() == 0


async def test_the_overloaded_mark_is_cleared_when_a_pop_brings_the_backlog_below_the_limit(
    redis: Redis, settings: Settings
) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    with pytest.raises(AdmissionRefused):
        await store.enqueue(A, [entry("a3")], now=T0)
    assert await redis.sismember(store.keys.overloaded, A)
    # When one task is taken
    await store.pop(A, "tok", 1, now=T0 + S)
    # Then the device is no longer overloaded and may enqueue again
    assert not await redis.sismember(store.keys.overloaded, A)
    assert "overloaded" not in await store.device_meta(A)
    assert await store.enqueue(A, [entry("a3")], now=T0 + S) == (2, 2)


async def test_the_overloaded_mark_is_cleared_when_a_cancel_brings_the_backlog_below_the_limit(
    redis: Redis, settings: Settings
) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    with pytest.raises(AdmissionRefused):
        await store.enqueue(A, [entry("a3")], now=T0)
    assert await store.cancel(A, "a2", now=T0 + S)
    assert not await redis.sismember(store.keys.overloaded, A)
    assert "overloaded" not in await store.device_meta(A)


async def test_enqueue_many_admits_each_device_on_its_own(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    out = await store.enqueue_many({A: tasks("a", 3), B: tasks("b", 2), C: tasks("c", 1)}, now=T0)
    assert isinstance(out[A], AdmissionRefused) and out[A].code is ScriptCode.DEVICE_LIMIT
    assert out[B] == (2, 2)
    assert out[C] == (1, 3)
    assert await store.admission_snapshot([A, B, C]) == (3, {A: 0, B: 2, C: 1})
