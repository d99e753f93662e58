"""resumeDevice (QueueStore.resume_due): a device backing off is scheduled again only once its backoff ended, with
its wait counted from its last claim; one left with nothing is forgotten and leaves the active set.
"""

from __future__ import annotations

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from tests.integration.sieve.redis.lua.helpers import NORMAL, T0, A, S, entry, ids, schedule_score, tasks


async def test_resume_due_before_the_deadline_does_nothing_and_after_it_schedules_the_device(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2, at=T0), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + 10 * S)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0 + 10 * S)
    # Before the deadline
    assert await store.resume_due(now=T0 + 40 * S - 1) == []
    assert (await store.device_meta(A))["state"] == "backoff"
    # At the deadline
    assert await store.resume_due(now=T0 + 40 * S) == [A]
    meta = await store.device_meta(A)
    assert meta["state"] == "ready"
    assert "unschedulable_until_ms" not in meta and "defer_reason" not in meta
    assert await redis.zscore(keys.backoff, A) is None
    # its wait counts from its last claim, so it is not pushed to the back by the backoff
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 10 * S
    assert (await store.rank(now=T0 + 41 * S)).mac == A
    # and a second resume finds nothing
    assert await store.resume_due(now=T0 + 50 * S) == []


async def test_enqueue_to_a_device_in_backoff_does_not_schedule_it(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    await store.enqueue(A, [entry("a9", at=T0 + S)], now=T0 + S)
    assert (await store.device_meta(A))["state"] == "backoff"
    assert (await store.rank(now=T0 + 2 * S)).mac is None
    assert await store.resume_due(now=T0 + 30 * S) == [A]
    assert await ids(store, A) == ["a0", "a9"]


async def test_a_device_that_resumes_with_nothing_left_is_no_longer_active(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    await store.cancel(A, "a0", now=T0 + S)
    await store.cancel(A, "a1", now=T0 + S)
    assert await store.resume_due(now=T0 + 30 * S) == [A]
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten
    assert not await redis.sismember(keys.devices, A)
