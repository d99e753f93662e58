"""A scripted worker for tests: a real gRPC client of the scheduler's Pull stream that records every
assignment and answers each with an ack or a nack chosen by the test (it runs no detection)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from sieve import rpc
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
                    acks, nacks = [], []
                    for a in response.batch.assignments:
                        self.received.append(a)
                        nack = self.policy(a)
                        if nack is None:
                            acks.append(scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token))
                        else:
                            nack.task_id, nack.lease_token = a.task_id, a.lease_token
                            nacks.append(nack)
                    self._outbox.put_nowait(
                        scheduler_pb2.PullRequest(acks=acks, nacks=nacks, credits=len(response.batch.assignments))
                    )
            except grpc.aio.AioRpcError as exc:
                self.error = exc

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
