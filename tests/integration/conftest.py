"""The platform in one test process: registry, scheduler, intake servers on loopback ports and one
worker, against this test's own Redis prefix and PostgreSQL schema."""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
import pytest
from redis.asyncio import Redis

from intake_svc.server import build as build_intake
from registry_svc.server import build as build_registry
from scheduler_svc.server import SchedulerApp
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.redis.queue_store import QueueStore
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, scheduler_pb2_grpc, types_pb2
from worker_svc.app import WorkerApp
from worker_svc.server import build as build_worker

FINAL = {types_pb2.TASK_STATUS_SUCCEEDED, types_pb2.TASK_STATUS_FAILED, types_pb2.TASK_STATUS_EXPIRED,
         types_pb2.TASK_STATUS_CANCELLED, types_pb2.TASK_STATUS_DEAD_LETTERED}


@dataclass
class Platform:
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


async def start_platform(settings: Settings, redis: Redis, pg: asyncpg.Pool,
                         workers: int = 1) -> AsyncIterator[Platform]:
    registry_app = await build_registry(settings, Stores.of(redis=redis))
    registry = await rpc.create_server(registry_app.service, "127.0.0.1:0", settings)
    settings = settings.replace(registry_addr=f"127.0.0.1:{registry.port}")
    scheduler = await build_scheduler(settings, Stores.of(redis=redis, pool=pg))
    sched_server = await rpc.create_server(scheduler.service, "127.0.0.1:0", settings)
    settings = settings.replace(scheduler_addr=f"127.0.0.1:{sched_server.port}")
    intake_app = await build_intake(settings, Stores.of(redis=redis, pool=pg))
    intake = await rpc.create_server(intake_app.service, "127.0.0.1:0", settings)
    channel = rpc.channel(f"127.0.0.1:{intake.port}", settings)
    platform = Platform(settings, intake_pb2_grpc.IntakeServiceStub(channel), scheduler,
                        QueueStore(redis, settings), pg, redis, [],
                        scheduler_pb2_grpc.SchedulerServiceStub(channel_s := rpc.channel(
                            settings.scheduler_addr, settings)))
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
        for server in (intake, sched_server, registry):
            await server.stop(1)


@asynccontextmanager
async def platform_with(settings: Settings, redis: Redis, pg: asyncpg.Pool, workers: int = 0,
                        **overrides: object) -> AsyncIterator[Platform]:
    """The platform with some settings changed, for one test."""
    async for p in start_platform(settings.replace(**overrides), redis, pg, workers=workers):
        yield p


@pytest.fixture
async def platform(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Platform]:
    async for p in start_platform(settings, redis, pg):
        yield p


@pytest.fixture
async def platform_without_workers(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Platform]:
    async for p in start_platform(settings, redis, pg, workers=0):
        yield p


async def wait_final(stub: intake_pb2_grpc.IntakeServiceStub, task_id: str,
                     timeout_s: float = 15) -> types_pb2.Task:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
        if task.status in FINAL or asyncio.get_running_loop().time() > deadline:
            return task
        await asyncio.sleep(0.02)


def tiny_png(width: int = 8, height: int = 8) -> bytes:
    """A valid grey PNG (no imaging library needed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = tiny_png()


def text_spec(device: str, text: str, **kw: object) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=text, **kw)
