"""Redis is not the record: when it loses its memory, intake refuses to enqueue (UNAVAILABLE) until a
scheduler has rebuilt every queue, counter and score from PostgreSQL; nothing accepted is lost."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from scheduler_svc.rebuild import Rebuilder
from sieve.db.tasks import TaskStore
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import platform_with, text_spec, wait_final
from tests.support.redis import delete_prefix


async def test_queues_are_rebuilt_from_postgresql_in_their_original_order(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, max_attempts=3) as p:
        # Given queued tasks on two devices
        first = [
            (await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", f"a{i}")))).task.task_id
            for i in range(5)
        ]
        second = [
            (
                await p.intake.Submit(
                    intake_pb2.SubmitRequest(
                        task=text_spec("AA-BB-CC-DD-EE-02", f"b{i}", priority=types_pb2.PRIORITY_HIGH)
                    )
                )
            ).task.task_id
            for i in range(3)
        ]
        # When Redis loses its memory
        await delete_prefix(redis, p.settings.redis_prefix)
        # Then intake refuses new work with UNAVAILABLE (clients retry) and records nothing
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-03", "lost?")))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await pg.fetchval("SELECT count(*) FROM tasks") == 8
        # When the scheduler notices and rebuilds
        assert await Rebuilder(p.queues, TaskStore(pg)).ensure()
        # Then every queue, counter and score is back, in the original order
        assert [e.task_id for e in await p.queues.queued("AA:BB:CC:DD:EE:01")] == first
        assert [e.task_id for e in await p.queues.queued("AA:BB:CC:DD:EE:02")] == second
        assert await p.queues.pending() == 8
        assert (await p.queues.rank()).mac == "AA:BB:CC:DD:EE:02"  # HIGH first, as before
        assert not await Rebuilder(p.queues, TaskStore(pg)).ensure()  # once is enough
        # and intake accepts again, and a worker finishes everything
        await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-03", "after")))
        await p.add_worker(worker_id="w-after")
        for task_id in first + second:
            assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED


async def test_the_housekeeping_tick_rebuilds_a_redis_that_came_back_empty(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, workers=1) as p:
        ids = [
            (
                await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(f"AA-BB-CC-DD-EE-{i:02x}", "x")))
            ).task.task_id
            for i in range(20)
        ]
        await delete_prefix(redis, p.settings.redis_prefix)
        # the scheduler's housekeeping (every 0.2 s here) notices the missing generation and rebuilds
        for _ in range(100):
            if await p.queues.generation():
                break
            await asyncio.sleep(0.05)
        assert await p.queues.generation()
        for task_id in ids:
            assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
        assert await pg.fetchval("SELECT count(*) FROM results") == 20
