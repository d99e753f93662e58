"""The platform in one test process with authentication on: registry, scheduler and intake servers on loopback
ports that accept only the credentials a test made (no anonymous callers), real workers with worker credentials,
and a raw Pull stream that sends whatever a rogue would.

Shared by the security tests of authentication, rogue workers and TLS (tests/security/test_*.py); the servers
start as every in-process stack's do (tests/support/inprocess.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import grpc
from redis.asyncio import Redis

from scheduler_svc.server import SchedulerApp
from sieve import rpc
from sieve.rpc.auth import credential_line, new_token
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import (
    intake_pb2,
    intake_pb2_grpc,
    registry_pb2,
    registry_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
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
class Credentials:
    """Bearer tokens a test made, and their stored entries (`name:role:sha256hex`)."""

    tokens: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def add(self, name: str, role: str) -> str:
        """A fresh token for credential `name` (a name may get several: rotation)."""
        token = new_token()
        self.tokens.setdefault(name, token)
        self.lines.append(credential_line(name, role, token))
        return token

    @property
    def text(self) -> str:
        return ",".join(self.lines)

    def write(self, path: Path) -> None:
        path.write_text("".join(line + "\n" for line in self.lines))


@dataclass
class SecureStack:
    """Intake, scheduler and registry servers in this process, authentication on."""

    settings: Settings
    addresses: dict[str, str]
    #: full name of every gRPC service a server here hosts -> that server's address
    hosts: dict[str, str]
    scheduler: SchedulerApp
    pg: asyncpg.Pool
    redis: Redis
    credentials: Credentials
    workers: list[WorkerApp] = field(default_factory=list)
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    def as_caller(self, token: str) -> Settings:
        """Client settings sending `token` ("" sends none)."""
        return self.settings.replace(auth_token=token)

    def token(self, name: str) -> str:
        """The (first) token of credential `name`."""
        return self.credentials.tokens[name]

    def as_(self, name: str) -> Settings:
        """Client settings sending the token of credential `name`."""
        return self.as_caller(self.token(name))

    def channel(self, service: str, token: str) -> grpc.aio.Channel:
        """A sieve client channel to `service` (intake, scheduler, registry), closed with the stack."""
        ch = rpc.channel(self.addresses[service], self.as_caller(token))
        self.channels.append(ch)
        return ch

    def intake(self, token: str) -> intake_pb2_grpc.IntakeServiceStub:
        return intake_pb2_grpc.IntakeServiceStub(self.channel("intake", token))

    def registry(self, token: str) -> registry_pb2_grpc.RegistryServiceStub:
        return registry_pb2_grpc.RegistryServiceStub(self.channel("registry", token))

    def scheduler_stub(self, token: str) -> scheduler_pb2_grpc.SchedulerServiceStub:
        return scheduler_pb2_grpc.SchedulerServiceStub(self.channel("scheduler", token))

    async def add_worker(self, worker_id: str, token: str, **overrides: object) -> WorkerApp:
        """A real worker (detection, result writes, registration) under a worker credential."""
        worker = await build_worker(
            self.as_caller(token).replace(worker_id=worker_id, **overrides), Stores.of(pool=self.pg)
        )
        self.workers.append(worker)
        return worker

    async def register(
        self, worker_id: str, token: str, concurrency: int, task_types: tuple[int, ...] = (types_pb2.TASK_TYPE_TEXT,)
    ) -> None:
        await self.registry(token).Register(
            registry_pb2.RegisterRequest(
                worker_id=worker_id, hostname="test", pid=1, task_types=list(task_types), concurrency=concurrency
            ),
            timeout=5,
        )

    async def status(self, task_id: str) -> str:
        return await self.pg.fetchval("SELECT status FROM tasks WHERE id = $1::uuid", task_id)


@asynccontextmanager
async def secure_stack(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials, **overrides: object
) -> AsyncIterator[SecureStack]:
    """The three servers, accepting `credentials` only (SIEVE_AUTH_TOKENS), with `overrides` applied."""
    settings = settings.replace(**{"allow_anonymous": False, "auth_tokens": credentials.text, **overrides})
    servers = await start_servers(
        settings,
        {
            "registry": Stores.of(redis=redis),
            "scheduler": Stores.of(redis=redis, pool=pg),
            "intake": Stores.of(redis=redis, pool=pg),
        },
    )
    settings = servers.settings
    stack = SecureStack(
        settings,
        {"intake": settings.intake_addr, "scheduler": settings.scheduler_addr, "registry": settings.registry_addr},
        servers.hosts,
        servers.scheduler,
        pg,
        redis,
        credentials,
    )
    try:
        yield stack
    finally:
        for worker in stack.workers:
            await worker.drain()
            await worker.close()
        for ch in stack.channels:
            await ch.close()
        await servers.stop()


@dataclass
class RawPull:
    """A Pull stream that sends exactly what the test tells it (a rogue worker): a first message, then
    `send`; it records every assignment it receives and never answers one by itself."""

    settings: Settings
    first: scheduler_pb2.PullRequest
    received: list[scheduler_pb2.Assignment] = field(default_factory=list)
    error: grpc.aio.AioRpcError | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _outbox: asyncio.Queue[scheduler_pb2.PullRequest | None] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None

    @classmethod
    def hello(
        cls,
        settings: Settings,
        worker_id: str,
        *,
        credits: int = 0,
        gpu: bool = False,
        task_types: tuple[int, ...] = (types_pb2.TASK_TYPE_TEXT,),
    ) -> RawPull:
        return cls(
            settings,
            scheduler_pb2.PullRequest(
                hello=scheduler_pb2.WorkerHello(worker_id=worker_id, task_types=list(task_types), gpu=gpu),
                credits=credits,
            ),
        )

    async def __aenter__(self) -> RawPull:
        self._outbox.put_nowait(self.first)
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._outbox.put_nowait(None)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, TimeoutError):
                await asyncio.wait_for(self._task, timeout=5)

    def send(self, request: scheduler_pb2.PullRequest) -> None:
        self._outbox.put_nowait(request)

    async def _run(self) -> None:
        async def requests() -> AsyncIterator[scheduler_pb2.PullRequest]:
            while (item := await self._outbox.get()) is not None:
                yield item

        try:
            async with rpc.channel(self.settings.scheduler_addr, self.settings) as channel:
                call = scheduler_pb2_grpc.SchedulerServiceStub(channel).Pull(requests())
                async for response in call:
                    self.received.extend(response.batch.assignments)
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        finally:
            self.ended.set()

    async def wait_for(self, count: int, timeout_s: float = 10) -> list[scheduler_pb2.Assignment]:
        await eventually(
            lambda: _at_least(self.received, count),
            timeout_s,
            f"got {len(self.received)} of {count} assignments (error: {self.error})",
        )
        return self.received

    async def refused(self, timeout_s: float = 5) -> grpc.StatusCode:
        """The status the server ended this stream with (fails when it is still open after `timeout_s`)."""
        await asyncio.wait_for(self.ended.wait(), timeout_s)
        assert self.error is not None, "the stream ended without an error"
        return self.error.code()


async def _at_least(items: list[object], count: int) -> bool:
    return len(items) >= count


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, what or "condition not reached in time"
        await asyncio.sleep(0.05)


async def wait_final(stub: intake_pb2_grpc.IntakeServiceStub, task_id: str, timeout_s: float = 20) -> types_pb2.Task:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)).task
        if task.status in FINAL or asyncio.get_running_loop().time() > deadline:
            return task
        await asyncio.sleep(0.05)


def text(device: str, body: str) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=body)
