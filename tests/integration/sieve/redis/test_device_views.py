"""The operators' view of devices (`QueueStore.device_views`, read by the web console): queue lengths by priority,
the oldest queued task, overloaded and backoff, for a random sample of the active devices of every shard plus the
devices asked for."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from sieve.v1 import types_pb2

TEXT = types_pb2.TASK_TYPE_TEXT
T0 = 1_700_000_000_000


def entries(prefix: str, priority: int, n: int, enqueued_ms: int) -> list[Entry]:
    return [Entry(f"{prefix}{i}", TEXT, priority, enqueued_ms + i, enqueued_ms + 3_600_000) for i in range(n)]


@pytest.mark.parametrize("shards", [1, 4])
async def test_each_device_shows_its_queues_by_priority_and_its_oldest_task(
    redis: Redis, settings: Settings, shards: int
) -> None:
    store = QueueStore(redis, settings.replace(redis_shards=shards))
    await store.mark_rebuilt("test")
    macs = [f"AA:BB:CC:DD:01:{i:02X}" for i in range(12)]
    for i, mac in enumerate(macs):
        await store.enqueue(mac, entries(f"{i}n-", 3, 2, T0 + 1000 * i), now=T0)
    # the first device also has HIGH work, queued before its NORMAL work
    await store.enqueue(macs[0], entries("0h-", 4, 3, T0 - 5000), now=T0)
    views = {v.mac: v for v in await store.device_views(sample=100)}
    assert set(views) == set(macs)
    assert views[macs[0]].queued == (0, 0, 2, 3, 0)
    assert views[macs[0]].oldest_enqueued_ms == T0 - 5000
    assert views[macs[5]].queued == (0, 0, 2, 0, 0) and views[macs[5]].oldest_enqueued_ms == T0 + 5000
    assert not any(v.overloaded or v.backoff_until_ms is not None for v in views.values())
    # a sample is at most `sample` a shard; devices asked for come whatever the sample
    sampled = await store.device_views(sample=1)
    assert 1 <= len(sampled) <= shards
    asked = await store.device_views(sample=0, also=[macs[3], "AA:BB:CC:DD:FF:FF"])
    assert [v.mac for v in asked] == [macs[3], "AA:BB:CC:DD:FF:FF"]
    assert asked[1].queued == (0, 0, 0, 0, 0) and asked[1].oldest_enqueued_ms is None
    assert await store.device_views(sample=0) == []


async def test_an_overloaded_device_is_shown_so(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings)
    await store.mark_rebuilt("test")
    await store.enqueue("AA:BB:CC:DD:02:01", entries("x", 3, 1, T0), now=T0)
    await store.mark_overloaded("AA:BB:CC:DD:02:01")
    (view,) = await store.device_views(sample=10)
    assert view.overloaded


@pytest.mark.parametrize("shards", [1, 4])
async def test_the_longest_waiting_ready_devices_come_first_whatever_their_caller_or_shard(
    redis: Redis, settings: Settings, shards: int
) -> None:
    store = QueueStore(redis, settings.replace(redis_shards=shards))
    await store.mark_rebuilt("test")
    macs = [f"AA:BB:CC:DD:03:{i:02X}" for i in range(10)]
    for i, mac in enumerate(macs):  # device i waits since T0 + i s, callers alternate
        batch = [Entry(f"{i}-{j}", TEXT, 3, T0 + 1000 * i, T0 + 3_600_000, caller=f"caller-{i % 2}") for j in range(2)]
        await store.enqueue(mac, batch, now=T0)
    assert await store.longest_waiting(3) == macs[:3]
    assert await store.longest_waiting(20) == macs
    assert await store.longest_waiting(0) == []
    views = {v.mac: v for v in await store.device_views(sample=0, also=macs)}
    assert [views[m].ready_since_ms for m in macs] == [float(T0 + 1000 * i) for i in range(10)]
