"""admissionReads (QueueStore.admission_view): the global pending count, a caller's open tasks and every device's
backlog, read in one call and changing nothing."""

from __future__ import annotations

from redis.asyncio import Redis

from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, TokenTake
from tests.integration.sieve.redis.lua.helpers import T0, A, B, C, snapshot


def task(task_id: str, caller: str) -> Entry:
    return Entry(task_id, 1, 3, T0, T0 + 3_600_000, caller=caller)


async def test_one_call_reads_pending_the_callers_open_tasks_and_each_backlog_and_changes_nothing(
    store: QueueStore, redis: Redis
) -> None:
    await store.enqueue_many({A: [task("a1", "alice"), task("a2", "alice")], B: [task("b1", "bob")]}, now=T0)
    before = await snapshot(redis, store.settings.redis_prefix)
    pending, backlogs, open_tasks, granted, wait_s = await store.admission_view([A, B, C], "alice")
    assert (pending, backlogs, open_tasks, granted, wait_s) == (3, {A: 2, B: 1, C: 0}, 2, 0, 0.0)
    assert await snapshot(redis, store.settings.redis_prefix) == before
    # without a caller, no open count; with a token take, the tokens come in the same round trip
    assert (await store.admission_view([B], ""))[2] == 0
    take = TokenTake("alice", 2, rate_per_s=10.0, burst=5)
    assert (await store.admission_view([A], "alice", take))[3:] == (2, 0.0)


async def test_the_reads_survive_redis_forgetting_its_scripts(store: QueueStore, redis: Redis) -> None:
    await store.enqueue(A, [task("a1", "alice")], now=T0)
    await redis.script_flush()
    take = TokenTake("alice", 1, rate_per_s=10.0, burst=5)
    assert (await store.admission_view([A], "alice", take))[:3] == (1, {A: 1}, 1)
