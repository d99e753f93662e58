"""Resource-aware dispatch with real worker processes whose readings are fixed through a file
(SIEVE_FIXED_RESOURCES=file:...): backpressure, recovery within a heartbeat, a hot worker withdrawing its
credits (and saying so in its metrics), and a worker that stops heartbeating."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from pathlib import Path

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.queue_store import QueueStore
from sieve.v1 import intake_pb2, intake_pb2_grpc, registry_pb2, registry_pb2_grpc, types_pb2
from tests.support.cluster import Cluster

pytestmark = pytest.mark.e2e

FAST = {"SIEVE_HEARTBEAT_INTERVAL_S": "1", "SIEVE_WORKER_TTL_S": "3", "SIEVE_PRESSURE_RETRY_S": "1"}


async def start_core(c: Cluster) -> None:
    c.env.update(FAST)
    await c.start_in_order()


async def start_worker(c: Cluster, name: str, readings: Path) -> None:
    await c.add_worker(name, metrics=True, SIEVE_FIXED_RESOURCES=f"file:{readings}", SIEVE_TEST_HOOKS="true")


def readings(tmp_path: Path, name: str, memory: int) -> Path:
    path = tmp_path / f"{name}.readings"
    path.write_text(f"cpu=10,memory={memory},gpu_memory=0")
    return path


async def submit(c: Cluster, count: int, tag: str) -> list[str]:
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        specs = [
            intake_pb2.TaskSpec(
                device_id=f"0C:00:00:00:{i % 40:02x}:01", type=types_pb2.TASK_TYPE_TEXT, text=f"{tag} {i}"
            )
            for i in range(count)
        ]
        reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
        return [item.task.task_id for item in reply.items]


async def workers_of(pg: asyncpg.Pool, ids: list[str], timeout_s: float = 30) -> list[str]:
    """The worker that stored each task's result, once all of them are stored."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = await pg.fetch("SELECT worker_id FROM results WHERE task_id = ANY($1::uuid[])", ids)
        if len(rows) == len(ids):
            return [r["worker_id"] for r in rows]
        assert time.monotonic() < deadline, f"{len(rows)} of {len(ids)} results"
        await asyncio.sleep(0.1)


async def listed(
    c: Cluster, *, having: tuple[str, ...] = (), timeout_s: float = 10
) -> dict[str, registry_pb2.WorkerInfo]:
    """ListWorkers by worker id; with `having`, once those workers are listed (a worker serves its health port
    as it starts registering: its first Register may land a moment later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with rpc.channel(c.settings.registry_addr, c.operator) as channel:
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            reply = await stub.ListWorkers(registry_pb2.ListWorkersRequest())
        workers = {w.worker_id: w for w in reply.workers}
        if all(w in workers for w in having) or time.monotonic() >= deadline:
            return workers
        await asyncio.sleep(0.1)


async def test_a_worker_over_its_memory_watermark_gets_nothing_until_it_drops_below_it(
    cluster_env: Cluster, pg: asyncpg.Pool, redis: Redis, tmp_path: Path
) -> None:
    c = cluster_env
    await start_core(c)
    hot, cool = readings(tmp_path, "hot", 90), readings(tmp_path, "cool", 20)
    await start_worker(c, "worker-hot", hot)
    await start_worker(c, "worker-cool", cool)
    # Given one worker at 90 % memory and one at 20 %
    workers = await listed(c, having=("worker-hot", "worker-cool"))
    assert not workers["worker-hot"].available and workers["worker-cool"].available
    assert "memory 90.0% >= 75.0%" in workers["worker-hot"].unavailable_reasons
    # When tasks come, Then the cool worker does all of them
    assert set(await workers_of(pg, await submit(c, 200, "first"))) == {"worker-cool"}
    # When the hot worker drops to 20 %
    hot.write_text("cpu=10,memory=20,gpu_memory=0")
    dropped = time.monotonic()
    while not (await listed(c))["worker-hot"].available:
        assert time.monotonic() - dropped < 2.5, "still unavailable after a heartbeat"
        await asyncio.sleep(0.1)
    # Then within a few seconds it takes work again (its own pressure check resumes it; tasks keep coming)
    seen: set[str] = set()
    for round_ in range(20):
        seen |= set(await workers_of(pg, await submit(c, 100, f"second-{round_}")))
        if "worker-hot" in seen:
            break
    assert "worker-hot" in seen, f"the hot worker took nothing {time.monotonic() - dropped:.1f}s after it cooled"
    assert time.monotonic() - dropped < 15


async def test_a_worker_that_gets_hot_withdraws_its_credits_and_another_worker_does_the_work(
    cluster_env: Cluster, pg: asyncpg.Pool, redis: Redis, tmp_path: Path
) -> None:
    c = cluster_env
    await start_core(c)
    # Given a worker that sent its credits while cool and then got hot
    first = readings(tmp_path, "first", 20)
    await start_worker(c, "worker-a", first)
    await asyncio.sleep(0.5)
    first.write_text("cpu=10,memory=95,gpu_memory=0")
    await asyncio.sleep(0.6)
    # When tasks arrive, they wait in their queues: the hot worker withdrew its credits (nothing handed out to
    # it, nothing to put back)
    ids = await submit(c, 5, "waiting")
    queues = QueueStore(redis, c.settings)
    await asyncio.sleep(1.0)
    assert await queues.pending() == 5
    assert await redis.zcard(queues.keys.leases) == 0
    # Then another worker does them, and no attempt was counted against them
    await start_worker(c, "worker-b", readings(tmp_path, "second", 20))
    assert set(await workers_of(pg, ids)) == {"worker-b"}
    assert {r["attempts"] for r in await pg.fetch("SELECT attempts FROM tasks WHERE id = ANY($1::uuid[])", ids)} == {1}
    # And the hot worker's metrics say it holds back for memory (and for how long)
    metrics = await scrape(c.metrics["worker-a"])
    assert metrics['sieve_worker_held_back{resource="memory"}'] == 1
    assert metrics['sieve_worker_held_back_seconds_total{resource="memory"}'] >= 1.0


async def scrape(address: str) -> dict[str, float]:
    def read() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
            return reply.read().decode()

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(await asyncio.to_thread(read)):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


async def test_a_worker_that_stops_heartbeating_is_dropped_and_its_tasks_are_done_by_another(
    cluster_env: Cluster, pg: asyncpg.Pool, redis: Redis, tmp_path: Path
) -> None:
    c = cluster_env
    await start_core(c)
    await start_worker(c, "worker-1", readings(tmp_path, "one", 20))
    # Given worker-1 frozen while it holds tasks
    ids = await submit(c, 300, "frozen")
    os.kill(c.procs["worker-1"].pid, signal.SIGSTOP)
    try:
        await start_worker(c, "worker-2", readings(tmp_path, "two", 20))
        # Then it leaves the registry after the TTL
        frozen_at = time.monotonic()
        while "worker-1" in await listed(c):
            assert time.monotonic() - frozen_at < 10, "worker-1 still listed"
            await asyncio.sleep(0.2)
        # and every task is done, what worker-1 held by worker-2
        done_by = await workers_of(pg, ids)
        assert "worker-2" in done_by
    finally:
        os.kill(c.procs["worker-1"].pid, signal.SIGCONT)
    # When worker-1 comes back, its late results are refused: each task has exactly one result
    await asyncio.sleep(1.5)
    assert await pg.fetchval("SELECT count(*) FROM results WHERE task_id = ANY($1::uuid[])", ids) == 300
    assert (
        await pg.fetchval("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'SUCCEEDED'", ids) == 300
    )
