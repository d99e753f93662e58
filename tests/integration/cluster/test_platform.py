"""The whole platform on a real Redis Cluster: registry, scheduler and intake in this process (tests/support/
platform.py) and a real worker, all on Sieve's cluster client — submit, schedule, run, store, ack — and a fault:
the master that serves the installation's slot is killed and comes back empty, and the scheduler rebuilds Redis
from PostgreSQL without losing anything it accepted."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from sieve.mac import normalize_mac as normalise
from sieve.redis.scheduler_state import SchedulerState
from sieve.settings import Settings
from sieve.v1 import intake_pb2, registry_pb2, scheduler_pb2, types_pb2
from tests.integration.sieve.redis.lua.helpers import assert_counters
from tests.support.platform import Platform, platform_with, wait_final
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.tasks import text_spec

#: seven devices: one in each of the 6 shards at least (crc32 of the MAC), so on every master
DEVICES = [f"AA-BB-CC-DD-EE-{i:02X}" for i in range(1, 8)]


async def submit(p: Platform, device: str, text: str) -> str:
    return str((await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(device, text)))).task.task_id)


async def test_submitted_tasks_are_scheduled_run_and_stored(
    cluster_settings: Settings, cluster_redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(cluster_settings, cluster_redis, pg, workers=1) as p:
        # Given texts of several devices, submitted one by one and in a batch
        ids = [await submit(p, device, f"加 微 信 免费领取 {i}") for i, device in enumerate(DEVICES)]
        batch = await p.intake.SubmitBatch(
            intake_pb2.SubmitBatchRequest(tasks=[text_spec(d, f"hello {d}") for d in DEVICES])
        )
        ids += [item.task.task_id for item in batch.items]
        assert len(ids) == 2 * len(DEVICES)
        # Then every one is handed to the worker, run, stored once and acked
        for task_id in ids:
            assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
        assert await pg.fetchval("SELECT count(*) FROM results") == len(ids)
        # and Redis is left with nothing queued or leased, its counters agreeing
        gauges = await SchedulerState(p.queues).gauges()
        assert (gauges.pending, gauges.leased, gauges.delayed) == (0, 0, 0)
        await assert_counters(cluster_redis, cluster_settings.redis_prefix, cluster_settings.redis_shards)
        # the registry lists its worker (SCAN over the masters), the scheduler answers its watermark
        workers = await _list_workers(p)
        assert [w.worker_id for w in workers] == ["worker-1"]
        watermark = await p.scheduler_stub.GetWatermark(scheduler_pb2.GetWatermarkRequest())
        assert (watermark.total_pending, watermark.leased, watermark.live_workers) == (0, 0, 1)


async def _list_workers(p: Platform) -> list[registry_pb2.WorkerInfo]:
    from sieve import rpc
    from sieve.v1 import registry_pb2_grpc

    channel = rpc.channel(p.settings.registry_addr, p.settings)
    try:
        reply = await registry_pb2_grpc.RegistryServiceStub(channel).ListWorkers(registry_pb2.ListWorkersRequest())
        return list(reply.workers)
    finally:
        await channel.close()


async def test_the_master_of_the_slot_restarted_empty_is_rebuilt_from_postgresql(
    cluster_settings: Settings, cluster_redis: Redis, pg: asyncpg.Pool, redis_cluster: LocalRedisCluster
) -> None:
    async with platform_with(cluster_settings, cluster_redis, pg, workers=0) as p:
        # Given tasks accepted and queued (no worker yet)
        accepted = [await submit(p, device, f"before {i}") for i, device in enumerate(DEVICES)]
        assert await p.queues.pending() == len(accepted)
        owner = redis_cluster.port_of_key(p.queues.keys.generation)
        # (the devices' tasks are in shards on every master; the master of shard 0, which holds the global keys too,
        # holds only some of the shards)
        masters = [redis_cluster.port_of_key(k.generation) for k in p.queues.shard_keys]
        lost = [s for s, port in enumerate(masters) if port == owner]
        assert 0 in lost and len(lost) < len(masters)
        assert {p.queues.shard_of(normalise(d)) for d in DEVICES} == set(range(len(masters)))
        assert set(masters) == set(redis_cluster.ports)
        # (the scheduler subscribes to wake-ups on that master)
        assert await _subscribers(redis_cluster, owner, p.queues.keys.wake_channel) == 1
        # When the master that serves the installation's slot dies
        redis_cluster.kill(owner)
        # Then a Submit meanwhile is refused, not half-accepted
        with pytest.raises(grpc.aio.AioRpcError):
            await submit(p, DEVICES[0], "during the outage")
        # When it comes back empty (same node, same slots, no data)
        redis_cluster.node(owner).start()
        redis_cluster.wait_ok()
        # Then the scheduler's housekeeping sees the generation gone and rebuilds every queue from PostgreSQL
        for _ in range(200):
            try:
                if await p.queues.generation():
                    break
            except Exception:  # the cluster client reconnecting to the restarted master
                pass
            await asyncio.sleep(0.05)
        assert await p.queues.generation() not in (None, "test")  # a new generation: it really was rebuilt
        # only the shards that master held were rebuilt; the others kept what they held
        kept = [await cluster_redis.get(k.generation) == "test" for k in p.queues.shard_keys]
        assert [s for s, same in enumerate(kept) if not same] == lost
        assert await p.queues.pending() == len(accepted)
        # and the scheduler listens for wake-ups on the restarted master again
        assert await _subscribers(redis_cluster, owner, p.queues.keys.wake_channel) == 1
        # and the intake accepts again, and a worker finishes everything that was accepted
        accepted.append(await _submit_when_ready(p, DEVICES[1], "after"))
        await p.add_worker(worker_id="w-after")
        for task_id in accepted:
            assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
        assert await pg.fetchval("SELECT count(*) FROM results") == len(accepted)
        assert await pg.fetchval("SELECT count(*) FROM tasks") == len(accepted)
        await assert_counters(cluster_redis, cluster_settings.redis_prefix, cluster_settings.redis_shards)


async def _submit_when_ready(p: Platform, device: str, text: str, timeout_s: float = 10) -> str:
    """Submits once the intake takes work again (UNAVAILABLE until the rebuild is seen)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await submit(p, device, text)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _subscribers(cluster: LocalRedisCluster, port: int, channel: str, timeout_s: float = 5) -> int:
    """Subscribers of `channel` on the node on `port`, once there are any (or 0 after `timeout_s`)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        with cluster.node(port).client() as node:
            [(_, count)] = node.pubsub_numsub(channel)
        if count or asyncio.get_running_loop().time() > deadline:
            return int(count)
        await asyncio.sleep(0.05)
