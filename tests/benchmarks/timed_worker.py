"""The fairness benchmarks' in-process worker: a real worker's parts (registration and heartbeats, the Pull
stream, the batch runner that marks tasks RUNNING and stores their results in PostgreSQL through group commits)
with detection replaced by a fixed wait, so that the order the scheduler hands work out in is what is measured,
not the matcher's own cost. It records which device each task came from and when it started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import asyncpg

from sieve.db import create_pool
from sieve.db.tasks import Outcome, Started, TaskStore
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, types_pb2
from tests.support.cluster import Cluster
from worker_svc.detection import Retry
from worker_svc.lexicon import Lexicon
from worker_svc.pressure import Pressure
from worker_svc.puller import Puller
from worker_svc.registration import RegistryClient
from worker_svc.resources import ResourceSampler
from worker_svc.runner import BatchRunner

#: how long each task takes by default (s), and how many run at once (BENCH_PARALLEL)
WORK_S = 0.002
PARALLEL = int(os.environ.get("BENCH_PARALLEL", "32"))


@dataclass(frozen=True, slots=True)
class Start:
    """One task as the timed worker ran it."""

    task_id: str
    device: str
    enqueued_ms: float
    started_ms: float
    work_s: float


class TimedRunner(BatchRunner):
    """BatchRunner whose detection waits `work_s(assignment)` (PARALLEL tasks at a time) before matching the text
    as a real worker does; everything else (RUNNING marks, results, acks) is the real runner's."""

    def __init__(
        self,
        tasks: TaskStore,
        lexicon: Lexicon,
        worker_id: str,
        settings: Settings,
        work_s: Callable[[scheduler_pb2.Assignment], float],
    ) -> None:
        super().__init__(tasks, lexicon, worker_id, settings)
        self.work_s = work_s
        self.slots = asyncio.Semaphore(PARALLEL)
        #: every task it ran (a task handed out again appears again)
        self.ran: list[Start] = []
        self._handed: dict[str, scheduler_pb2.Assignment] = {}

    async def __call__(
        self, assignments: list[scheduler_pb2.Assignment]
    ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        for a in assignments:
            self._handed[str(uuid.UUID(a.task_id))] = a
        try:
            return await super().__call__(assignments)
        finally:
            for a in assignments:
                self._handed.pop(str(uuid.UUID(a.task_id)), None)

    async def detect_all(self, started: Sequence[Started]) -> list[Outcome | Retry]:
        async def one(task: Started) -> Outcome | Retry:
            a = self._handed[str(task.task_id)]
            cost = self.work_s(a)
            async with self.slots:
                self.ran.append(
                    Start(str(task.task_id), a.device_id, a.enqueued_at.ToMilliseconds(), time.time() * 1000, cost)
                )
                await asyncio.sleep(cost)
            return self.detect(task)

        return list(await asyncio.gather(*(one(t) for t in started)))


class TimedWorker:
    """One in-process worker of a benchmark's cluster. Its resource readings are fixed at 0: it is the
    benchmark's instrument, and the CPU other processes of a shared machine burn is no part of the order the
    scheduler hands work out in, so it never holds back."""

    def __init__(
        self, settings: Settings, worker_id: str, work_s: Callable[[scheduler_pb2.Assignment], float] = lambda a: WORK_S
    ) -> None:
        self.worker_id = worker_id
        self.settings = settings.replace(
            worker_id=worker_id,
            worker_concurrency=4 * PARALLEL,
            test_hooks=True,
            fixed_resources="cpu=0,memory=0,gpu_memory=0",
            db_pool_min=1,
            db_pool_max=4,
        )
        self.work_s = work_s
        self.stop = asyncio.Event()
        self.runner: TimedRunner | None = None

    @classmethod
    def of(
        cls, cluster: Cluster, worker_id: str, work_s: Callable[[scheduler_pb2.Assignment], float] = lambda a: WORK_S
    ) -> TimedWorker:
        """A timed worker of `cluster` with the worker credential named `worker_id`."""
        settings = cluster.settings if cluster.anonymous else cluster.as_caller(worker_id, "worker")
        return cls(settings, worker_id, work_s)

    @property
    def starts(self) -> list[Start]:
        return self.runner.ran if self.runner is not None else []

    async def wait_started(self, count: int, timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while len({s.task_id for s in self.starts}) < count:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.worker_id}: {len(self.starts)} of {count} tasks started in {timeout_s}s")
            await asyncio.sleep(0.05)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TimedWorker]:
        s = self.settings
        pool: asyncpg.Pool = await create_pool(s, migrate_first=False)
        lexicon = Lexicon(pool, s)
        await lexicon.load()
        self.runner = runner = TimedRunner(TaskStore(pool), lexicon, self.worker_id, s, self.work_s)
        sampler = ResourceSampler(s)
        types = [types_pb2.TASK_TYPE_TEXT]
        puller = Puller(s, self.worker_id, types, False, 4 * PARALLEL, runner, Pressure(sampler, s))
        registry = RegistryClient(s, sampler, types, lambda: puller.in_use, concurrency=lambda: 4 * PARALLEL)
        background = [asyncio.create_task(c) for c in (*(w.run() for w in runner.writers), registry.run(self.stop))]
        pulling = asyncio.create_task(puller.run(self.stop))
        try:
            yield self
        finally:
            self.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pulling, timeout=10)
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await pool.close()
