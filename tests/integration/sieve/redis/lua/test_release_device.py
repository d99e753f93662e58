"""releaseDevice (QueueStore.release) and the dispatch lock: the wait restarts at the release, an emptied device
goes idle, wrong or repeated tokens are refused, an expired lock still counts as its owner's, a forced release;
extend_lock.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from sieve.errors import LockNotOwned
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import NORMAL, T0, A, B, S, entry, schedule_score, snapshot, tasks


async def test_release_with_a_wrong_token_raises_and_changes_nothing(
    store: QueueStore, redis: Redis, settings: Settings
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    before = await snapshot(redis, settings.redis_prefix)
    with pytest.raises(LockNotOwned):
        await store.release(A, "other", now=T0 + 2 * S)
    assert await snapshot(redis, settings.redis_prefix) == before


async def test_release_reschedules_the_device_with_its_wait_restarting_now(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    await store.pop(A, "tok", 1, now=T0 + 50 * S)
    await store.release(A, "tok", now=T0 + 50 * S)
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 50 * S
    meta = await store.device_meta(A)
    assert (meta["state"], meta["since_ms"], meta["oldest_ms"]) == ("ready", str(T0 + 50 * S), str(T0))
    assert "token" not in meta
    assert (await store.rank(now=T0 + 60 * S)).longest_wait_ms == 10 * S


async def test_a_release_later_than_the_claim_restarts_the_wait_at_the_release(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given A claimed at T0+50s whose dispatch ends at T0+80s, and B arriving at T0+60s
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    await store.pop(A, "tok", 1, now=T0 + 50 * S)
    await store.enqueue(B, [entry("b1", at=T0 + 60 * S)], now=T0 + 60 * S)
    await store.release(A, "tok", now=T0 + 80 * S)
    # Then A's wait restarts at the release, and B (waiting since T0+60s) comes first
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 80 * S
    assert (await store.rank(now=T0 + 90 * S)).mac == B


async def test_release_of_an_emptied_device_makes_it_idle_and_inactive(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 5, now=T0 + S)
    await store.release(A, "tok", now=T0 + S)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["class"], meta["backlog"]) == ("idle", "0", "0")
    assert "oldest_ms" not in meta
    assert not await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + 2 * S)).mac is None


async def test_the_owner_may_still_release_after_its_lock_expired(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await redis.delete(keys.lock(A))  # the lock's TTL ran out
    with pytest.raises(LockNotOwned):
        await store.release(A, "other", now=T0 + 2 * S)
    await store.release(A, "tok", now=T0 + 2 * S)
    assert (await store.device_meta(A))["state"] == "ready"


async def test_a_forced_release_frees_a_device_whose_holder_died(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "dead-holder", 1, now=T0 + S)
    await store.release(A, "*", now=T0 + 2 * S)
    assert await redis.get(keys.lock(A)) is None
    assert (await store.rank(now=T0 + 3 * S)).mac == A


async def test_a_release_that_is_repeated_is_refused(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await store.release(A, "tok", now=T0 + S)
    with pytest.raises(LockNotOwned):
        await store.release(A, "tok", now=T0 + 2 * S)


async def test_extend_lock_renews_only_for_the_holder(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await redis.pexpire(keys.lock(A), 1000)
    assert await store.extend_lock(A, "other") is False
    assert await redis.pttl(keys.lock(A)) <= 1000
    assert await store.extend_lock(A, "tok") is True
    assert await redis.pttl(keys.lock(A)) > 800 * S
    await store.release(A, "tok", now=T0)
