"""Scheduler replicas divide the shards by renewable leases: two replicas hold half each, a replica that stops
gives its shards back and the other takes them all, one that dies loses them once its leases run out, and a
replica that joins gets its share from the others' extras."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import now_ms
from sieve.redis.shard_leases import ShardLeases
from sieve.settings import Settings

SHARDS = 4
TTL_MS = 300


def replica(redis: Redis, settings: Settings, name: str, shards: int = SHARDS) -> ShardLeases:
    return ShardLeases(redis, Keys(settings.redis_prefix), shards, name, TTL_MS)


async def step(redis: Redis, settings: Settings, *replicas: ShardLeases) -> None:
    """Each replica says it is alive and takes one balancing step, in turn (as their loops do, twice a second)."""
    key = Keys(settings.redis_prefix).schedulers
    for r in replicas:
        await redis.hset(key, r.replica, str(int(now_ms())))
    for r in replicas:
        alive = await redis.hgetall(key)
        await r.balance(r.live(alive, now_ms()))


async def test_two_replicas_hold_two_shards_each_and_no_shard_twice(redis: Redis, settings: Settings) -> None:
    a, b = replica(redis, settings, "a"), replica(redis, settings, "b")
    await step(redis, settings, a)
    assert a.owned == [0, 1, 2, 3]  # alone, it holds every shard
    for _ in range(2):  # b joins: a gives back its extras, b takes them
        await step(redis, settings, a, b)
    assert len(a.owned) == len(b.owned) == 2 and sorted(a.owned + b.owned) == [0, 1, 2, 3]
    assert await a.holders() == {s: "a" for s in a.owned} | {s: "b" for s in b.owned}


async def test_a_replica_that_stops_gives_its_shards_to_the_other(redis: Redis, settings: Settings) -> None:
    a, b = replica(redis, settings, "a"), replica(redis, settings, "b")
    for _ in range(2):
        await step(redis, settings, a, b)
    # When b stops in order (its sign of life removed, its leases given back)
    await b.release()
    await redis.hdel(Keys(settings.redis_prefix).schedulers, "b")
    await step(redis, settings, a)
    assert a.owned == [0, 1, 2, 3] and b.owned == []


async def test_a_replica_that_dies_loses_its_shards_within_a_lease_ttl(redis: Redis, settings: Settings) -> None:
    a, b = replica(redis, settings, "a"), replica(redis, settings, "b")
    for _ in range(2):
        await step(redis, settings, a, b)
    # When b goes silent (no sign of life, no renewal) the others keep stepping
    deadline = asyncio.get_running_loop().time() + 3 * TTL_MS / 1000
    while a.owned != [0, 1, 2, 3] and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(TTL_MS / 5000)
        await step(redis, settings, a)
    assert a.owned == [0, 1, 2, 3]


async def test_a_third_replica_gets_its_share_and_every_shard_has_one_holder(redis: Redis, settings: Settings) -> None:
    a, b, c = (replica(redis, settings, n, shards=6) for n in "abc")
    for _ in range(2):
        await step(redis, settings, a, b)
    assert (len(a.owned), len(b.owned)) == (3, 3)
    for _ in range(3):
        await step(redis, settings, a, b, c)
    assert sorted(len(r.owned) for r in (a, b, c)) == [2, 2, 2]
    assert sorted(a.owned + b.owned + c.owned) == list(range(6))


async def test_with_one_shard_every_replica_holds_it_and_no_lease_is_taken(redis: Redis, settings: Settings) -> None:
    a, b = replica(redis, settings, "a", shards=1), replica(redis, settings, "b", shards=1)
    await step(redis, settings, a, b)
    assert a.owned == b.owned == [0]
    assert await a.holders() == {}
