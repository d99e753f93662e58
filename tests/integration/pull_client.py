"""A scripted worker for tests: a real gRPC client of the scheduler's Pull stream that records every
assignment and answers each with an ack or a nack chosen by the test (it runs no detection). With `results` it
stores a result for each task it acks before acking, as a real worker does (an ack without one is put back)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC

import grpc

from sieve import rpc
from sieve.db.tasks import Outcome, TaskStore
from sieve.redis.leases import lease_number
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

#: decides what to answer to an assignment: None acks it, a Nack is sent as is
Policy = Callable[[scheduler_pb2.Assignment], scheduler_pb2.Nack | None]


def ack_all(_: scheduler_pb2.Assignment) -> None:
    return None


@dataclass
class ScriptedWorker:
    settings: Settings
    worker_id: str = "scripted"
    task_types: tuple[int, ...] = (types_pb2.TASK_TYPE_TEXT,)
    gpu: bool = False
    credits: int = 50
    policy: Policy = ack_all
    received: list[scheduler_pb2.Assignment] = field(default_factory=list)
    _outbox: asyncio.Queue[scheduler_pb2.PullRequest | None] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None
    error: grpc.aio.AioRpcError | None = None
    #: where to store a result for each task before acking it (None: ack without one)
    results: TaskStore | None = None

    async def __aenter__(self) -> ScriptedWorker:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._outbox.put_nowait(None)
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await asyncio.wait_for(self._task, timeout=5)

    async def _run(self) -> None:
        hello = scheduler_pb2.WorkerHello(worker_id=self.worker_id, task_types=list(self.task_types), gpu=self.gpu)
        self._outbox.put_nowait(scheduler_pb2.PullRequest(hello=hello, credits=self.credits))

        async def requests() -> AsyncIterator[scheduler_pb2.PullRequest]:
            while (item := await self._outbox.get()) is not None:
                yield item

        async with rpc.channel(self.settings.scheduler_addr, self.settings) as channel:
            call = scheduler_pb2_grpc.SchedulerServiceStub(channel).Pull(requests())
            try:
                async for response in call:
                    acks, nacks, done = [], [], []
                    for a in response.batch.assignments:
                        self.received.append(a)
                        nack = self.policy(a)
                        if nack is None:
                            acks.append(scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token))
                            done.append(a)
                        else:
                            nack.task_id, nack.lease_token = a.task_id, a.lease_token
                            nacks.append(nack)
                    await self._store(done)
                    self._outbox.put_nowait(
                        scheduler_pb2.PullRequest(acks=acks, nacks=nacks, credits=len(response.batch.assignments))
                    )
            except grpc.aio.AioRpcError as exc:
                self.error = exc

    async def _store(self, done: list[scheduler_pb2.Assignment]) -> None:
        """Marks the tasks RUNNING and stores a PASS result for each, as a worker does before its acks."""
        if self.results is None or not done:
            return
        attempts = [
            (uuid.UUID(a.task_id), lease_number(a.lease_token), a.attempt, a.assigned_at.ToDatetime(UTC)) for a in done
        ]
        lease = {uuid.UUID(a.task_id): lease_number(a.lease_token) for a in done}
        started = await self.results.start(self.worker_id, attempts)
        outcomes = [Outcome(t.task_id, lease[t.task_id], self.worker_id, "PASS", "[]", "x") for t in started]
        if outcomes:
            await self.results.finish(outcomes)

    def announce(self, *, gpu: bool) -> None:
        """Sends a later hello on the open stream: the worker's GPU mode changed."""
        self.gpu = gpu
        hello = scheduler_pb2.WorkerHello(worker_id=self.worker_id, task_types=list(self.task_types), gpu=gpu)
        self._outbox.put_nowait(scheduler_pb2.PullRequest(hello=hello))

    async def wait_for(self, count: int, timeout_s: float = 10) -> list[scheduler_pb2.Assignment]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.received) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{self.worker_id} got {len(self.received)} of {count} assignments")
            await asyncio.sleep(0.01)
        return self.received
