"""What the Lua script tests share: the clock and the devices they use, entries, and ways to look at the whole
keyspace (the counter invariant, a snapshot that proves a refusal changed nothing).

Time is controlled by passing `now=` explicitly (milliseconds from T0).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from sieve.redis.entry import Entry
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from tests.support.counters import counters

T0 = 1_700_000_000_000
S = 1000  # one second in ms
A = "AA:BB:CC:DD:EE:01"
B = "AA:BB:CC:DD:EE:02"
C = "AA:BB:CC:DD:EE:03"
BACKGROUND, LOW, NORMAL, HIGH, CRITICAL = 1, 2, 3, 4, 5
TEXT, OCR = 1, 2


def entry(
    task_id: str,
    *,
    prio: int = NORMAL,
    at: int = T0,
    ttl_ms: int = 3600 * S,
    attempt: int = 0,
    defers: int = 0,
    task_type: int = TEXT,
) -> Entry:
    return Entry(task_id, task_type, prio, at, at + ttl_ms, attempt, defers)


def tasks(prefix: str, n: int, *, prio: int = NORMAL, at: int = T0) -> list[Entry]:
    return [entry(f"{prefix}{i}", prio=prio, at=at) for i in range(n)]


async def assert_counters(redis: Redis, prefix: str, shards: int = 1) -> None:
    """GET pending (of every shard, summed) == sum of LLEN of every queue == sum of every device's meta backlog."""
    now = await counters(redis, Keys(prefix, 0, shards))
    assert now.consistent, f"pending {now.pending}, queued {now.queued}, backlog {now.backlog}"


async def snapshot(redis: Redis, prefix: str) -> dict[str, Any]:
    """Every key under the prefix with its type and full value (to prove a refusal changed nothing)."""
    out: dict[str, Any] = {}
    async for key in redis.scan_iter(match=Keys(prefix).all_pattern, count=1000):
        kind = await redis.type(key)
        if kind == "string":
            value: Any = await redis.get(key)
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "set":
            value = sorted(await redis.smembers(key))
        elif kind == "zset":
            value = await redis.zrange(key, 0, -1, withscores=True)
        else:
            value = kind
        out[key] = (kind, value)
    return out


async def ids(store: QueueStore, mac: str) -> list[str]:
    return [e.task_id for e in await store.queued(mac)]


async def schedule_score(redis: Redis, keys: Keys, mac: str, prio: int, weight: int = 1) -> float | None:
    return await redis.zscore(keys.schedule(prio, weight), mac)


async def serve(store: QueueStore, mac: str, n: int, at: int, token: str = "tok") -> list[Entry]:
    """One dispatch: pop up to n tasks and release the device at the same moment."""
    popped = await store.pop(mac, token, n, now=at)
    assert popped.ready
    await store.release(mac, token, now=at)
    return popped.taken
