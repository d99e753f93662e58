"""A task is accepted only when both its row and its queue entry exist: an enqueue that fails
withdraws the row, and an unreachable Redis or PostgreSQL answers UNAVAILABLE having recorded nothing."""

from __future__ import annotations

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from intake_svc.server import build
from intake_svc.submission import Submitter
from intake_svc.validation import validate_spec
from sieve import rpc
from sieve.db.tasks import TaskStore
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc
from tests.integration.conftest import text_spec


class EnqueueFails(QueueStore):
    """Real Redis, but the enqueue step breaks as if Redis went away right after the row was written."""

    async def enqueue_many(self, groups: dict[str, list[Entry]], *, now: int | None = None, **_: object) -> dict:
        raise RedisConnectionError("injected: Redis went away")


async def test_a_task_whose_enqueue_fails_is_withdrawn(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    # Given a submitter whose enqueue fails after the row is written
    submitter = Submitter(TaskStore(pg), EnqueueFails(redis, settings), settings)
    task = validate_spec(text_spec("AA-BB-CC-DD-EE-01", "hello"), "task", "anonymous", settings)
    # When the task is submitted
    with pytest.raises(RedisConnectionError):
        await submitter.submit([task])
    # Then neither a row nor a queue entry is left
    assert await pg.fetchval("SELECT count(*) FROM tasks") == 0
    assert await QueueStore(redis, settings).pending() == 0


async def test_an_unreachable_redis_answers_unavailable_and_records_nothing(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", decode_responses=True, socket_connect_timeout=0.2)
    app = await build(settings, Stores.of(redis=dead, pool=pg))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", "hello")))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await pg.fetchval("SELECT count(*) FROM tasks") == 0
    await server.stop(1)
    await dead.aclose()


async def test_an_unreachable_postgresql_answers_unavailable_and_queues_nothing(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given an intake whose PostgreSQL does not answer
    unreachable = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/postgres", min_size=0, max_size=1)
    app = await build(settings, Stores.of(redis=redis, pool=unreachable))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    # When a device submits, Then the caller is told to retry and nothing is queued
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", "hello")))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await QueueStore(redis, settings).pending() == 0
    await server.stop(1)
    await unreachable.close()
