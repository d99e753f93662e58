"""promoteDelayed (QueueStore.promote_due): delayed tasks whose time came go back at the front of their queues and
an idle device becomes schedulable again.
"""

from __future__ import annotations

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from tests.integration.sieve.redis.lua.helpers import T0, A, S, serve, tasks


async def test_promoting_delayed_tasks_makes_an_idle_device_schedulable(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    await store.enqueue(A, tasks("a", 1, at=T0), now=T0)
    await serve(store, A, 1, T0 + S)
    await store.requeue(A, [("a0", 1)], count_attempt=False, reason="later", retry_at_ms=T0 + 10 * S, now=T0 + 2 * S)
    assert (await store.device_meta(A))["state"] == "idle"
    assert (await store.rank(now=T0 + 5 * S)).mac is None
    assert await store.promote_due(now=T0 + 10 * S) == 1
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("ready", "1")
    assert await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + 11 * S)).mac == A
