"""The fault-injection harness: every service as a process (tests/support/cluster.py) on a Redis server of its
own (tests/support/servers.py, so it can be restarted for real), a load of known tasks submitted with idempotency
keys and retried like a client would, and the final audit in PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import grpc
from redis.asyncio import Redis

from sieve import rpc
from sieve.launch import free_port
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import Cluster

TASKS = 2000
DEVICES = 50
#: short timers so that faults resolve within seconds
FAST_ENV = {
    "SIEVE_LEASE_TTL_S": "3",
    "SIEVE_HEARTBEAT_INTERVAL_S": "1",
    "SIEVE_WORKER_TTL_S": "4",
    "SIEVE_HOUSEKEEPING_INTERVAL_S": "0.3",
    "SIEVE_SHUTDOWN_GRACE_S": "5",
    "SIEVE_MAX_TOTAL_PENDING": "20000",
    "SIEVE_MAX_PER_DEVICE_PENDING": "2000",
    "SIEVE_RETRY_BACKOFF_BASE_S": "0.2",
}


@dataclass
class Load:
    """Submits TASKS tasks over DEVICES devices, each with its own idempotency key, retrying refusals."""

    settings: Settings
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> task id
    retries: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, batch: int = 50, pause_s: float = 0.02) -> None:
        specs = [
            intake_pb2.TaskSpec(
                device_id=f"0F:00:00:00:{i % DEVICES:02x}:00",
                type=types_pb2.TASK_TYPE_TEXT,
                text=f"加 微 信 {i}" if i % 4 == 0 else f"hello {i}",
                idempotency_key=f"load-{i}",
            )
            for i in range(TASKS)
        ]
        async with rpc.channel(self.settings.intake_addr, self.settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            for i in range(0, TASKS, batch):
                await self._submit(stub, specs[i : i + batch])
                await asyncio.sleep(pause_s)
        self.done.set()

    async def _submit(self, stub: intake_pb2_grpc.IntakeServiceStub, specs: list[intake_pb2.TaskSpec]) -> None:
        waiting = list(specs)
        deadline = time.monotonic() + 60
        while waiting:
            try:
                reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=waiting), timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
                assert time.monotonic() < deadline, "intake stayed unavailable"
                self.retries += 1
                await asyncio.sleep(0.2)
                continue
            again = []
            for spec, item in zip(waiting, reply.items, strict=True):
                if item.code == 0:
                    self.accepted[spec.idempotency_key] = item.task.task_id
                else:
                    again.append(spec)
            waiting = again
            if waiting:
                self.retries += 1
                await asyncio.sleep(0.2)


@dataclass
class Audit:
    case: str
    submitted: int
    accepted: int
    succeeded: int
    results: int
    duplicates: int
    lost: int
    extra_rows: int
    pending_left: int
    refusals: int
    #: what the fault hit and how long recovery took, where the case measures it
    note: str = ""

    def row(self) -> str:
        return (
            f"{self.case:<34} {self.submitted:>9} {self.accepted:>8} {self.succeeded:>9} {self.results:>7} "
            f"{self.duplicates:>10} {self.lost:>5} {self.refusals:>8}" + (f"  {self.note}" if self.note else "")
        )

    HEADER = (
        f"{'case':<34} {'submitted':>9} {'accepted':>8} {'succeeded':>9} {'results':>7} "
        f"{'duplicates':>10} {'lost':>5} {'refused':>8}"
    )


async def wait_all_final(pg: asyncpg.Pool, ids: list[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        open_ = await pg.fetchval(
            "SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status IN ('PENDING', 'ASSIGNED', 'RUNNING')",
            ids,
        )
        if open_ == 0:
            return
        if time.monotonic() > deadline:
            rows = await pg.fetch("SELECT status, count(*) FROM tasks GROUP BY 1")
            raise AssertionError(f"{open_} tasks still open: {[tuple(r) for r in rows]}")
        await asyncio.sleep(0.2)


async def audit(case: str, load: Load, pg: asyncpg.Pool, redis: Redis, settings: Settings, logs: Path) -> Audit:
    ids = list(load.accepted.values())
    await wait_all_final(pg, ids)
    statuses = Counter(r["status"] for r in await pg.fetch("SELECT status FROM tasks WHERE id = ANY($1::uuid[])", ids))
    finals = await pg.fetch(
        "SELECT id, (SELECT count(*) FROM jsonb_array_elements(history) h "
        "WHERE h->>'status' IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED', 'DEAD_LETTERED')) AS n FROM tasks"
    )
    duplicates = sum(1 for r in finals if r["n"] != 1)
    results = await pg.fetchval("SELECT count(*) FROM results")
    rows = await pg.fetchval("SELECT count(*) FROM tasks")
    queues = QueueStore(redis, settings)
    refusals = await asyncio.to_thread(count_refusals, logs)
    return Audit(
        case,
        TASKS,
        len(ids),
        statuses["SUCCEEDED"],
        results,
        duplicates,
        lost=len(ids) - sum(statuses.values()),
        extra_rows=rows - len(ids),
        pending_left=await queues.pending(),
        refusals=refusals,
    )


def count_refusals(logs: Path) -> int:
    """Results and acks refused by fencing (a stale lease), as the workers and schedulers logged them."""
    pattern = re.compile(r"(\d+) (?:results|acks) refused")
    return sum(int(n) for p in logs.glob("*.log") for n in pattern.findall(p.read_text(errors="replace")))


#: every case's audit, printed as a table at the end of the run
AUDITS: list[Audit] = []


async def progress(pg: asyncpg.Pool) -> int:
    return await pg.fetchval("SELECT count(*) FROM results")


async def when_results_reach(pg: asyncpg.Pool, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while await progress(pg) < count:
        assert time.monotonic() < deadline, f"results stuck at {await progress(pg)}"
        await asyncio.sleep(0.02)


def unique_settings(settings: Settings) -> Settings:
    return settings.replace(redis_prefix=f"fault-{uuid.uuid4().hex[:8]}")


async def start_services(c: Cluster, *, schedulers: int = 1, workers: int = 2) -> None:
    """Registry, `schedulers` replicas, intake and `workers` workers, all healthy."""
    c.env.update(FAST_ENV)
    c.start("registry", "registry_svc")
    await c.wait_healthy(c.settings.registry_addr, "registry")
    addresses = [c.settings.scheduler_addr] + [f"127.0.0.1:{free_port()}" for _ in range(schedulers - 1)]
    for i, address in enumerate(addresses):
        name = "scheduler" if i == 0 else f"scheduler-{i + 1}"
        c.start(name, "scheduler_svc", SIEVE_SCHEDULER_ADDR=address)
        await c.wait_healthy(address, name)
    # workers (and intake) know every replica: pick_first moves to the next when one goes away
    c.env["SIEVE_SCHEDULER_ADDR"] = "ipv4:" + ",".join(addresses)
    c.start("intake", "intake_svc")
    await c.wait_healthy(c.settings.intake_addr, "intake")
    for i in range(1, workers + 1):
        await start_worker(c, f"worker-{i}")


async def start_worker(c: Cluster, name: str) -> None:
    await c.add_worker(name, metrics=True)


def in_flight(c: Cluster, name: str) -> float:
    """What worker `name` holds now (its sieve_worker_in_flight gauge)."""
    with urllib.request.urlopen(f"http://{c.metrics[name]}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.search(r"^sieve_worker_in_flight (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def when_holding(c: Cluster, name: str, timeout_s: float = 30) -> None:
    """Returns once worker `name` holds tasks (a worker holding back, or between batches, holds none: freezing it
    then would test nothing)."""
    deadline = time.monotonic() + timeout_s
    while await asyncio.to_thread(in_flight, c, name) <= 0:
        assert time.monotonic() < deadline, f"{name} held no tasks for {timeout_s}s"
        await asyncio.sleep(0.01)


def kill9(c: Cluster, name: str) -> None:
    os.kill(c.procs[name].pid, signal.SIGKILL)
    c.procs[name].wait()
