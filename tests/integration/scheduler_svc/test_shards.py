"""The scheduler with the keyspace in 4 shards on one Redis: two replicas divide the shards between them by leases
(two each, none twice), every task submitted over many devices is done once, and when one replica stops the other
takes every shard; a Redis made with another number of shards is not rebuilt beside itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from redis.asyncio import Redis

from scheduler_svc.app import SchedulerApp
from scheduler_svc.rebuild import Rebuilder, ShardCountChanged
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.db.tasks import TaskStore
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import platform_with, text_spec, wait_final
from tests.integration.sieve.redis.lua.helpers import T0, S, assert_counters
from tests.support.redis import delete_prefix

SHARDS = 4


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def divided(*replicas: SchedulerApp) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        owned = [r.housekeeping.owned_shards for r in replicas]
        flat = sorted(s for shards in owned for s in shards)
        return flat == list(range(SHARDS)) and len({len(shards) for shards in owned}) == 1

    return check


async def test_two_replicas_divide_the_shards_and_every_task_is_done_once(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    await QueueStore(redis, settings.replace(redis_shards=SHARDS)).mark_rebuilt("test")
    async with platform_with(settings, redis, pg, workers=1, redis_shards=SHARDS) as p:
        # Given a second scheduler replica on the same Redis
        second = await build_scheduler(p.settings, Stores.of(redis=redis, pool=pg))
        server = await rpc.create_server(second.service, "127.0.0.1:0", p.settings)
        try:
            # Then the two divide the four shards, two each
            await eventually(divided(p.scheduler, second))
            # When 80 tasks over 20 devices (in every shard) are submitted
            specs = [text_spec(f"0B:00:00:00:00:{d:02x}", f"t{d}-{i}") for d in range(20) for i in range(4)]
            reply = await p.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
            ids = [item.task.task_id for item in reply.items if item.code == 0]
            assert len(ids) == 80 and {p.queues.shard_of(f"0B:00:00:00:00:{d:02X}") for d in range(20)} == {0, 1, 2, 3}
            # Then every one is done, once
            for task_id in ids:
                assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
            assert await pg.fetchval("SELECT count(*) FROM results") == 80
            assert await p.queues.pending() == 0
            await assert_counters(redis, p.settings.redis_prefix, SHARDS)
        finally:
            await server.stop(1)
        # When the second replica stops, the first holds every shard
        await eventually(divided(p.scheduler))


async def test_a_redis_made_with_another_number_of_shards_is_not_rebuilt_beside_itself(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given a Redis of one shard holding queued work (shard 0 is the whole keyspace there)
    one = QueueStore(redis, settings)
    await one.enqueue_many({f"0C:00:00:00:00:{d:02X}": [Entry(f"t{d}", 1, 3, T0, T0 + 3600 * S)] for d in range(8)})
    # When the scheduler starts with 4 shards: shard 0 kept its memory, the others have none
    four = QueueStore(redis, settings.replace(redis_shards=SHARDS))
    assert await four.lost_shards() == [1, 2, 3]
    # Then it refuses to rebuild them (the devices' tasks are in shard 0 under the old mapping)
    with pytest.raises(ShardCountChanged, match="SIEVE_REDIS_SHARDS"):
        await Rebuilder(four, TaskStore(pg)).ensure()
    assert await four.lost_shards() == [1, 2, 3]
    # and once Redis is emptied, it rebuilds every shard and records their number
    await delete_prefix(redis, settings.redis_prefix)
    assert await Rebuilder(four, TaskStore(pg)).ensure()
    assert await four.lost_shards() == [] and await four.shard_counts([0, 1, 2, 3]) == dict.fromkeys(range(4), 4)
