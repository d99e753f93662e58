"""The scheduler's Redis layer on a real Redis Cluster: the device queues' scripts (one EVALSHA each, single and
pipelined, reloaded when the master lost them), MULTI/EXEC with WATCH, pipelined reads, SCAN over patterns, the
wake-up channel, the dead letters, the worker records and the lease key — through the same public APIs the
services use, with Sieve's own cluster client (SIEVE_REDIS_CLUSTER=true)."""

from __future__ import annotations

import asyncio
import collections
import contextlib

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from sieve.redis.dead_letter_store import DeadLetterStore
from sieve.redis.queue_store import QueueStore
from sieve.redis.scheduler_state import SchedulerState, Turn
from sieve.redis.worker_records import WorkerRecords
from sieve.settings import Settings
from sieve.v1 import registry_pb2, types_pb2
from tests.integration.sieve.redis.lua.helpers import HIGH, T0, A, B, C, S, assert_counters, ids, tasks
from tests.support.redis_cluster import LocalRedisCluster


async def test_the_client_is_a_cluster_client_and_each_shard_has_one_master_and_the_shards_use_all_three(
    cluster_redis: Redis, cluster_settings: Settings, redis_cluster: LocalRedisCluster
) -> None:
    assert isinstance(cluster_redis, RedisCluster)
    assert len(cluster_redis.get_primaries()) == 3
    store = QueueStore(cluster_redis, cluster_settings)
    shard_masters = []
    for keys in store.shard_keys:
        # every key of a shard is in the slot of its hash tag, on one master
        owners = {redis_cluster.port_of_key(key) for key in (keys.pending, keys.meta(A), keys.queue(B, 3), keys.leases)}
        assert len(owners) == 1
        shard_masters.append(owners.pop())
    # and the shards are spread over every master (two each, give or take one: sieve/redis/keys.py shard_tag)
    assert set(shard_masters) == set(redis_cluster.ports)
    assert max(collections.Counter(shard_masters).values()) <= 3
    # devices queued over many MACs really land on all three masters
    macs = [f"AA:BB:CC:DD:01:{i:02X}" for i in range(60)]
    await store.enqueue_many({mac: tasks(f"{i}-", 1, at=T0) for i, mac in enumerate(macs)}, now=T0)
    held = {}
    for port in redis_cluster.ports:
        with redis_cluster.node(port).client() as node:
            held[port] = len(list(node.scan_iter(match=store.keys.meta_pattern, count=1000)))
    assert sum(held.values()) == 60 and all(n > 0 for n in held.values()), held
    assert await store.pending() == 60


async def test_enqueue_rank_pop_ack_and_requeue(cluster_redis: Redis, cluster_settings: Settings) -> None:
    store = QueueStore(cluster_redis, cluster_settings)
    # Given two devices' tasks, queued in one pipelined round trip of enqueueMany
    outcome = await store.enqueue_many({A: tasks("a", 3, at=T0), B: tasks("b", 2, prio=HIGH, at=T0)}, now=T0)
    # (A and B are in two shards, on two masters: each reply counts what the other shards held before the call)
    assert store.shard_of(A) != store.shard_of(B)
    assert {mac: backlog for mac, (backlog, _) in outcome.items()} == {A: 3, B: 2}  # type: ignore[misc]
    assert await store.pending() == 5
    # Then the HIGH device ranks first, and popping it leases its tasks
    assert (await store.rank(now=T0 + S)).mac == B
    popped = await store.pop(B, "tok", 10, now=T0 + S)
    assert popped.ready and [e.task_id for e in popped.taken] == ["b0", "b1"]
    await store.release(B, "tok", now=T0 + S)
    # and a claim round (claimDevices, device keys named in the script) serves A and ranks the next
    claim = await store.claim("tok2", 2, {types_pb2.TASK_TYPE_TEXT: 2}, max_devices=4, now=T0 + 2 * S)
    # (a device's first serve since it became active takes one task, and it may be named again for the rest)
    assert [(mac, e.task_id) for mac, p in claim.devices for e in p.taken] == [(A, "a0"), (A, "a1")]
    assert claim.next.mac == A
    assert await store.pending() == 1
    # When b0 is acked with its lease number, a stale ack refused, and b1 requeued with its attempt counted
    leases = {e.task_id: e.attempt for _, p in claim.devices for e in p.taken}
    acked = await store.ack([("b0", 1), ("a0", leases["a0"] + 5)])
    assert acked == [True, False]
    requeued = await store.requeue(B, [("b1", 1)], count_attempt=True, reason="worker gone", now=T0 + 3 * S)
    assert requeued.requeued == 1 and requeued.put_back == ["b1"]
    # Then b1 is queued again, a0 and a1 still leased, and the counters agree
    assert await ids(store, B) == ["b1"]
    assert sorted((await store.lease_facts(["a0", "a1", "b0"])).keys()) == ["a0", "a1"]
    assert await store.pending() == 2
    await assert_counters(cluster_redis, cluster_settings.redis_prefix, cluster_settings.redis_shards)


async def test_scripts_the_master_lost_are_loaded_again(
    cluster_redis: Redis, cluster_settings: Settings, redis_cluster: LocalRedisCluster
) -> None:
    store = QueueStore(cluster_redis, cluster_settings)
    await store.enqueue(A, tasks("a", 1, at=T0), now=T0)
    # When the master of B's shard forgets every script (as after a restart), the other masters keep theirs
    with redis_cluster.node(redis_cluster.port_of_key(store.keys_of(B).pending)).client() as node:
        node.script_flush()
    # Then a pipelined call over several shards (EVALSHA answered NOSCRIPT on one master) loads them again and
    # runs again only the calls that master refused: nothing is queued twice
    outcome = await store.enqueue_many({B: tasks("b", 1, at=T0), C: tasks("c", 1, at=T0)}, now=T0)
    assert {mac: backlog for mac, (backlog, _) in outcome.items()} == {B: 1, C: 1}  # type: ignore[misc]
    assert await store.pending() == 3
    for port in redis_cluster.ports:
        with redis_cluster.node(port).client() as node:
            node.script_flush()
    # and a single call too
    assert (await store.rank(now=T0 + S)).mac in {A, B, C}
    assert (await store.pop(A, "tok", 1, now=T0 + S)).ready


async def test_locks_and_turns_use_watch_and_multi(cluster_redis: Redis, cluster_settings: Settings) -> None:
    store = QueueStore(cluster_redis, cluster_settings)
    state = SchedulerState(store)
    await store.enqueue(A, tasks("a", 1, at=T0), now=T0)
    assert (await store.pop(A, "tok", 1, now=T0)).ready
    # the device lock is renewed by its holder only (WATCH / MULTI / EXEC on the master of its slot)
    assert await store.extend_lock(A, "tok")
    assert not await store.extend_lock(A, "other")
    # a turn is taken once, kept by its holder, given up
    assert await state.take_turn(Turn.RECONCILE, "r1", 5000)
    assert not await state.take_turn(Turn.RECONCILE, "r2", 5000)
    assert await state.keep_turn(Turn.RECONCILE, "r1", 5000)
    assert not await state.keep_turn(Turn.RECONCILE, "r2", 5000)
    assert await state.keep_turn(Turn.RECONCILE, "r1", 0)
    assert await state.take_turn(Turn.RECONCILE, "r2", 5000)
    assert await state.take_rebuild_lock("x", 5)
    assert not await state.take_rebuild_lock("y", 5)
    await state.drop_rebuild_lock("x")
    assert await state.take_rebuild_lock("y", 5)


async def test_a_wake_up_reaches_the_subscriber(cluster_redis: Redis, cluster_settings: Settings) -> None:
    store = QueueStore(cluster_redis, cluster_settings)
    state = SchedulerState(store)
    woken = asyncio.Event()
    subscribed = asyncio.Event()

    async def listen() -> None:
        async with contextlib.aclosing(state.wake_ups()) as wake_ups:
            subscribed.set()
            async for _ in wake_ups:
                woken.set()

    listener = asyncio.create_task(listen())
    try:
        await subscribed.wait()
        # enqueueMany PUBLISHes when a device becomes schedulable; the subscription may need a moment first
        for i in range(50):
            await store.enqueue(f"AA:BB:CC:DD:EE:{i + 16:02X}", tasks(f"w{i}-", 1, at=T0), now=T0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), 0.1)
            if woken.is_set():
                break
        assert woken.is_set(), "no wake-up arrived from the cluster"
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def test_gauges_dead_letters_and_the_lease_key(cluster_redis: Redis, cluster_settings: Settings) -> None:
    store = QueueStore(cluster_redis, cluster_settings.replace(max_attempts=1))
    state = SchedulerState(store)
    await store.enqueue(A, tasks("a", 2, at=T0), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    # a counted requeue at the last attempt dead-letters the task
    requeued = await store.requeue(A, [(popped.taken[0].task_id, 1)], count_attempt=True, reason="boom", now=T0 + S)
    assert [d["task_id"] for d in requeued.dead_letters] == ["a0"]
    gauges = await state.gauges(listed=5)
    assert (gauges.pending, gauges.leased, gauges.delayed, gauges.dead_letters) == (0, 1, 0, 1)
    dead = DeadLetterStore(store)
    [(raw, record)] = await dead.all()
    assert record["task_id"] == "a0"
    assert await dead.remove([raw]) == 1 and await dead.count() == 0
    await dead.append([record])
    assert await dead.clear() == 1
    # the lease key is made once and shared
    first, second = state.lease_signer(), state.lease_signer()
    await first.refresh()
    await second.refresh()
    assert first.shared and second.shared
    token = first.sign("a1", 1, "w1")
    assert second.verify("a1", "w1", token) == 1
    await state.publish_watermark({"pending": 0}, 5000)
    await state.say_alive("replica-1", T0)
    assert await state.replicas() == {"replica-1": str(T0)}


async def test_worker_records_are_saved_beaten_and_listed_by_scan(
    cluster_redis: Redis, cluster_settings: Settings
) -> None:
    records = WorkerRecords(cluster_redis, cluster_settings)
    for i in range(3):
        await records.save(
            registry_pb2.RegisterRequest(
                worker_id=f"w{i}", hostname="h", pid=i + 1, task_types=[types_pb2.TASK_TYPE_TEXT], concurrency=2
            )
        )
    assert await records.heartbeat("w1", None)
    assert not await records.heartbeat("nobody", None)
    # SCAN over every master finds the three records (and nothing of other prefixes)
    assert [r.worker_id for r in await records.list()] == ["w0", "w1", "w2"]
    assert await records.live_count() == 3
    assert await records.remove("w0")
    assert [r.worker_id for r in await records.list(types_pb2.TASK_TYPE_TEXT)] == ["w1", "w2"]
