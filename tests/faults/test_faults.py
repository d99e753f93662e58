"""Nothing accepted is ever lost or done twice: 2 000 tasks over 50 devices per case, with a fault in
the middle, audited in PostgreSQL (every accepted task final exactly once, results = successes, no
duplicates, no rows that were not accepted, counters equal to the queues)."""

from __future__ import annotations

import asyncio
import os
import signal

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.queue_store import QueueStore
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.faults.harness import (
    AUDITS,
    TASKS,
    Audit,
    Load,
    audit,
    count_refusals,
    kill9,
    start_services,
    when_holding,
    when_results_reach,
)
from tests.support.cluster import Cluster
from tests.support.servers import RedisProcess

pytestmark = pytest.mark.timeout(240)


def assert_clean(a: Audit) -> None:
    AUDITS.append(a)
    assert a.accepted == TASKS, a
    assert a.succeeded == a.accepted == a.results, a
    assert (a.duplicates, a.lost, a.extra_rows, a.pending_left) == (0, 0, 0, 0), a


async def run_with(c: Cluster, fault, batch: int = 50, pause_s: float = 0.02) -> Load:
    load = Load(c.settings)
    runner = asyncio.create_task(load.run(batch=batch, pause_s=pause_s))
    await fault()
    await runner
    return load


async def test_two_workers_killed_mid_batch_lose_nothing(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    await start_services(c, workers=3)

    async def fault() -> None:
        await when_results_reach(pg, 300)
        kill9(c, "worker-1")
        await when_results_reach(pg, 900)
        kill9(c, "worker-2")

    load = await run_with(c, fault)
    assert_clean(await audit("kill -9 two workers", load, pg, own_redis, c.settings, c.log_dir))


async def test_one_of_two_scheduler_replicas_killed_loses_nothing(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    await start_services(c, schedulers=2, workers=2)

    async def fault() -> None:
        await when_results_reach(pg, 500)
        kill9(c, "scheduler")

    load = await run_with(c, fault)
    assert_clean(await audit("kill -9 one of two schedulers", load, pg, own_redis, c.settings, c.log_dir))


async def test_redis_restarted_empty_loses_nothing(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis, redis_server: RedisProcess
) -> None:
    c = fault_cluster
    await start_services(c, workers=2)

    async def fault() -> None:
        await when_results_reach(pg, 500)
        redis_server.kill()
        await asyncio.sleep(0.5)
        redis_server.start()  # same port, nothing in it

    load = await run_with(c, fault)
    assert_clean(await audit("Redis restarted empty", load, pg, own_redis, c.settings, c.log_dir))


async def test_postgresql_connections_dropped_lose_nothing(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    await start_services(c, workers=2)

    async def fault() -> None:
        await when_results_reach(pg, 500)
        conn = await asyncpg.connect(c.settings.database_url)
        try:
            dropped = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1 AND pid <> pg_backend_pid()",
                f"sieve:{c.settings.database_schema}",
            )
        finally:
            await conn.close()
        assert dropped > 0

    load = await run_with(c, fault)
    assert_clean(await audit("PostgreSQL connections dropped", load, pg, own_redis, c.settings, c.log_dir))


async def test_a_frozen_worker_past_its_lease_has_its_late_results_refused(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    await start_services(c, workers=2)

    async def fault() -> None:
        await when_results_reach(pg, 400)
        # a text task takes a millisecond: a freeze right after worker-1 was seen holding tasks can still find
        # it done with them (its acks sent) and then tests nothing; it is frozen again, up to three times, until
        # what it sent late was refused (the load runs ~25 s)
        for _ in range(3):
            await when_holding(c, "worker-1")
            os.kill(c.procs["worker-1"].pid, signal.SIGSTOP)
            await asyncio.sleep(5)  # lease TTL is 3 s: its tasks go to worker-2
            os.kill(c.procs["worker-1"].pid, signal.SIGCONT)
            await asyncio.sleep(2)
            if await asyncio.to_thread(count_refusals, c.log_dir):
                break

    load = await run_with(c, fault, batch=50, pause_s=0.6)
    a = await audit("SIGSTOP a worker past its lease", load, pg, own_redis, c.settings, c.log_dir)
    assert_clean(a)
    # its leases ran out and were reclaimed, and what it sent late was refused
    assert "reclaimed" in c.log_of("scheduler", 2000)
    assert a.refusals > 0, a


async def test_one_idempotency_key_from_twenty_clients_makes_one_task(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    await start_services(c, workers=2)
    spec = intake_pb2.TaskSpec(
        device_id="0F:00:00:00:99:00", type=types_pb2.TASK_TYPE_TEXT, text="once only", idempotency_key="the-one"
    )

    async def one_client() -> tuple[str, bool]:
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            reply = await intake_pb2_grpc.IntakeServiceStub(channel).Submit(intake_pb2.SubmitRequest(task=spec))
            return reply.task.task_id, reply.deduplicated

    async def fault() -> None:
        answers = await asyncio.gather(*(one_client() for _ in range(20)))
        assert len({task_id for task_id, _ in answers}) == 1
        assert sum(1 for _, dedup in answers if not dedup) == 1
        (the_one,) = {task_id for task_id, _ in answers}
        fault.the_one = the_one  # type: ignore[attr-defined]

    load = await run_with(c, fault)
    load.accepted["the-one"] = fault.the_one  # type: ignore[attr-defined]
    a = await audit("one idempotency key, 20 clients", load, pg, own_redis, c.settings, c.log_dir)
    a.submitted += 1
    AUDITS.append(a)
    assert a.accepted == TASKS + 1 and a.succeeded == a.results == TASKS + 1, a
    assert (a.duplicates, a.lost, a.extra_rows, a.pending_left) == (0, 0, 0, 0), a
    assert await QueueStore(own_redis, c.settings).pending() == 0
