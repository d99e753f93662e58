"""The platform in one test process: registry, scheduler and intake servers on loopback ports
(tests/support/inprocess.py) and real workers, against the test's own Redis prefix and PostgreSQL schema, with a
client stub of the intake and of the scheduler. The integration tests' `platform` fixtures are made of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
from redis.asyncio import Redis

from scheduler_svc.server import SchedulerApp
from sieve import rpc
from sieve.redis.queue_store import QueueStore
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, scheduler_pb2_grpc, types_pb2
from tests.support.inprocess import start_servers
from worker_svc.app import WorkerApp
from worker_svc.server import build as build_worker

FINAL = {
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_EXPIRED,
    types_pb2.TASK_STATUS_CANCELLED,
    types_pb2.TASK_STATUS_DEAD_LETTERED,
}


@dataclass
class Platform:
    """The servers of one test in this process, its workers, and client stubs of the intake and the scheduler."""

    settings: Settings
    intake: intake_pb2_grpc.IntakeServiceStub
    scheduler: SchedulerApp
    queues: QueueStore
    pg: asyncpg.Pool
    redis: Redis
    workers: list[WorkerApp]
    scheduler_stub: scheduler_pb2_grpc.SchedulerServiceStub

    async def add_worker(self, **overrides: object) -> WorkerApp:
        worker = await build_worker(self.settings.replace(**overrides), Stores.of(pool=self.pg))
        self.workers.append(worker)
        return worker


async def start_platform(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, workers: int = 1
) -> AsyncIterator[Platform]:
    servers = await start_servers(
        settings,
        {
            "registry": Stores.of(redis=redis),
            "scheduler": Stores.of(redis=redis, pool=pg),
            "intake": Stores.of(redis=redis, pool=pg),
        },
    )
    settings = servers.settings
    channel = rpc.channel(settings.intake_addr, settings)
    platform = Platform(
        settings,
        intake_pb2_grpc.IntakeServiceStub(channel),
        servers.scheduler,
        QueueStore(redis, settings),
        pg,
        redis,
        [],
        scheduler_pb2_grpc.SchedulerServiceStub(channel_s := rpc.channel(settings.scheduler_addr, settings)),
    )
    for i in range(workers):
        await platform.add_worker(worker_id=f"worker-{i + 1}")
    try:
        yield platform
    finally:
        await channel.close()
        await channel_s.close()
        for worker in platform.workers:
            await worker.drain()
            await worker.close()
        await servers.stop()


@asynccontextmanager
async def platform_with(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, workers: int = 0, **overrides: object
) -> AsyncIterator[Platform]:
    """The platform with some settings changed, for one test."""
    async for p in start_platform(settings.replace(**overrides), redis, pg, workers=workers):
        yield p


async def wait_final(stub: intake_pb2_grpc.IntakeServiceStub, task_id: str, timeout_s: float = 15) -> types_pb2.Task:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
        if task.status in FINAL or asyncio.get_running_loop().time() > deadline:
            return task
        await asyncio.sleep(0.02)
