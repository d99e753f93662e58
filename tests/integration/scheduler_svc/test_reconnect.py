"""A worker that reconnects to a new scheduler process re-announces what it holds, and the new process settles it
at once: adopted leases (exact token, signed for that worker; Redis still holds them under the same lease
number; no other stream holds them), the acks that had not arrived, and — from a replica that died — the leases
it handed out that never reached a worker. Refused: tokens of another worker, guessed tokens, leases another live
stream holds, leases already settled (dropped quietly, not counted as fencing refusals).

Two scheduler replicas in this process on the same Redis prefix and PostgreSQL schema; "crashing" one forgets its
memory (sessions, loops) without putting anything back, as kill -9 does."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC

import asyncpg
import pytest
from redis.asyncio import Redis

from intake_svc.server import build as build_intake
from scheduler_svc.server import SchedulerApp
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.db.tasks import Outcome, TaskStore
from sieve.redis.leases import lease_number
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, scheduler_pb2
from tests.integration.conftest import text_spec
from tests.security.auth_stack import RawPull, eventually

DEVICE = "AA-BB-CC-DD-EE-77"
MAC = "AA:BB:CC:DD:EE:77"


@dataclass
class Replica:
    scheduler: SchedulerApp
    server: rpc.RunningServer
    settings: Settings  # the client settings that reach this replica

    async def crash(self) -> None:
        """What kill -9 leaves: no loop runs, nothing is put back, the streams break."""
        for task in self.server.tasks:
            task.cancel()
        for task in self.server.tasks:
            with __import__("contextlib").suppress(asyncio.CancelledError, Exception):
                await task
        for session in list(self.scheduler.board.sessions):
            self.scheduler.board.close(session)
        await self.server.server.stop(0)


@dataclass
class Pair:
    a: Replica
    b: Replica
    intake: intake_pb2_grpc.IntakeServiceStub
    tasks: TaskStore
    queues: QueueStore
    redis: Redis
    pg: asyncpg.Pool

    async def submit(self, count: int) -> list[str]:
        reply = await self.intake.SubmitBatch(
            intake_pb2.SubmitBatchRequest(tasks=[text_spec(DEVICE, f"task {i}") for i in range(count)])
        )
        return [item.task.task_id for item in reply.items]

    async def run(self, worker_id: str, a: scheduler_pb2.Assignment) -> scheduler_pb2.Ack:
        """What a real worker does with an assignment: mark it RUNNING, store its result; returns its ack."""
        lease = lease_number(a.lease_token)
        [started] = await self.tasks.start(
            worker_id, [(uuid.UUID(a.task_id), lease, a.attempt, a.assigned_at.ToDatetime(UTC))]
        )
        assert await self.tasks.finish([Outcome(started.task_id, lease, worker_id, "PASS", "[]", "x")])
        return scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token)

    async def status(self, task_id: str) -> str:
        return await self.pg.fetchval("SELECT status FROM tasks WHERE id = $1", uuid.UUID(task_id))


@pytest.fixture
async def pair(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Pair]:
    settings = settings.replace(worker_reconnect_max_s=0.2, scheduler_dead_after_s=1.0)
    tasks = TaskStore(pg)
    intake_app = await build_intake(settings, Stores.of(redis=redis, pool=pg))
    intake = await rpc.create_server(intake_app.service, "127.0.0.1:0", settings)
    replicas = []
    for _ in range(2):
        scheduler = await build_scheduler(settings, Stores.of(redis=redis, pool=pg))
        server = await rpc.create_server(scheduler.service, "127.0.0.1:0", settings)
        replicas.append(Replica(scheduler, server, settings.replace(scheduler_addr=f"127.0.0.1:{server.port}")))
    channel = rpc.channel(f"127.0.0.1:{intake.port}", settings)
    try:
        yield Pair(
            replicas[0],
            replicas[1],
            intake_pb2_grpc.IntakeServiceStub(channel),
            tasks,
            QueueStore(redis, settings),
            redis,
            pg,
        )
    finally:
        await channel.close()
        for replica in replicas:
            with __import__("contextlib").suppress(Exception):
                await replica.server.stop(1)
        await intake.stop(1)


def hello(worker_id: str, held: list[scheduler_pb2.Assignment], **kw: object) -> scheduler_pb2.PullRequest:
    request = scheduler_pb2.PullRequest(hello=scheduler_pb2.WorkerHello(worker_id=worker_id, task_types=[1]), **kw)
    for a in held:
        request.hello.held.add(task_id=a.task_id, lease_token=a.lease_token, assigned_at=a.assigned_at)
    return request


async def test_a_new_scheduler_adopts_the_reconnecting_workers_leases_and_settles_its_owed_acks_at_once(
    pair: Pair,
) -> None:
    ids = await pair.submit(3)
    # Given a worker holding three tasks of scheduler A, two of them done (their acks never reached A)
    async with RawPull.hello(pair.a.settings, "w1", credits=3) as stream:
        assignments = await stream.wait_for(3)
        owed = [await pair.run("w1", a) for a in assignments[:2]]
        # When A dies (kill -9) and the worker reconnects to B, re-announcing the three and sending the two acks
        await pair.a.crash()
    began = time.monotonic()
    first = hello("w1", assignments, acks=owed)
    async with RawPull(pair.b.settings, first) as again:
        streams = pair.b.scheduler.streams

        async def settled() -> bool:
            return streams.reconnect_leases["acked"] == 2 and not await pair.queues.lease_facts(
                [a.task_id for a in assignments[:2]]
            )

        # Then B adopts all three (once A's renewals are old enough) and settles the two acks: no lease expiry
        await eventually(settled, 10, f"not settled: {dict(streams.reconnect_leases)}")
        assert time.monotonic() - began < 5
        assert streams.reconnect_leases["adopted"] == 3 and streams.fencing_refusals == 0
        [session] = [s for s in pair.b.scheduler.board.sessions if s.worker_id == "w1"]
        third = assignments[2]
        assert session.held == {third.task_id: (MAC, lease_number(third.lease_token))}
        assert session.tokens[third.task_id] == third.lease_token
        # and the one still running is settled on the new stream under its old token when it is done
        again.send(scheduler_pb2.PullRequest(acks=[await pair.run("w1", third)]))
        await eventually(lambda: _none(pair.queues.lease_facts([third.task_id])), 5, "third not settled")
    assert [await pair.status(i) for i in ids] == ["SUCCEEDED"] * 3
    assert await pair.queues.pending() == 0


async def test_reannounced_leases_that_are_not_the_workers_are_refused_and_settled_ones_dropped(pair: Pair) -> None:
    ids = await pair.submit(3)
    async with RawPull.hello(pair.a.settings, "w1", credits=3) as stream:
        assignments = await stream.wait_for(3)
        done = await pair.run("w1", assignments[0])
        stream.send(scheduler_pb2.PullRequest(acks=[done]))  # this one reached A: its lease is gone
        await eventually(lambda: _none(pair.queues.lease_facts([done.task_id])), 5, "ack not settled by A")
        await pair.a.crash()
    held_elsewhere = (await pair.submit(1))[0]
    streams = pair.b.scheduler.streams
    async with RawPull.hello(pair.b.settings, "w3", credits=1) as holder:
        [theirs] = await holder.wait_for(1)
        assert theirs.task_id == held_elsewhere
        guessed = scheduler_pb2.Assignment(
            task_id=assignments[2].task_id, lease_token=f"{lease_number(assignments[2].lease_token)}.0123456789abcdef"
        )
        # When another worker id re-announces w1's lease with w1's real token, one re-announces a guessed token,
        # and w1 re-announces a lease that another stream holds and one that A had already settled
        async with (
            RawPull(pair.b.settings, hello("w2", [assignments[1], guessed])) as thief,
            RawPull(pair.b.settings, hello("w1", [theirs, assignments[0]], acks=[done])) as late,
        ):
            await eventually(
                lambda: _true(streams.reconnect_leases["refused"] >= 3), 10, f"{dict(streams.reconnect_leases)}"
            )
            await eventually(
                lambda: _true(streams.reconnect_leases["gone"] >= 1), 10, f"{dict(streams.reconnect_leases)}"
            )
            # Then none is adopted: the leases stay where they were, and the settled one's ack is dropped quietly
            assert streams.reconnect_leases["adopted"] == 0
            assert streams.fencing_refusals == 0 and streams.reannounced_gone == 1
            sessions = {s.worker_id: s for s in pair.b.scheduler.board.sessions}
            assert not sessions["w2"].held and not sessions["w1"].held
            assert set(sessions["w3"].held) == {held_elsewhere}
            facts = await pair.queues.lease_facts([a.task_id for a in assignments[1:]])
            assert sorted(facts) == sorted(a.task_id for a in assignments[1:])
            assert thief.error is None and late.error is None
    assert await pair.status(ids[0]) == "SUCCEEDED"


async def test_what_a_dead_replica_handed_out_and_nobody_reannounced_goes_back_uncounted(pair: Pair) -> None:
    # Given replica A alive with a worker holding one task (A renews its lease)
    [live] = await pair.submit(1)
    async with RawPull.hello(pair.a.settings, "w-live", credits=1) as stream:
        [kept] = await stream.wait_for(1)

        async def keep_talking() -> None:
            while True:
                stream.send(scheduler_pb2.PullRequest())
                await asyncio.sleep(0.2)

        talker = asyncio.create_task(keep_talking())
        try:
            # and a replica "ghost" that popped two tasks and died before they reached any worker
            lost = await pair.submit(2)
            popped = await pair.queues.pop(MAC, "ghost-dispatch", 2, release=True)
            assert sorted(e.task_id for e in popped.taken) == sorted(lost)
            await pair.redis.hset(pair.queues.keys.schedulers, "ghost", int(now_ms()))
            # When it stays silent past scheduler_dead_after_s, Then a live replica puts its leases back at once
            # (uncounted, with the reason), long before the lease TTL, and forgets it
            await eventually(
                lambda: _true(
                    pair.b.scheduler.housekeeping.orphans_put_back + pair.a.scheduler.housekeeping.orphans_put_back == 2
                ),
                10,
                "the dead replica's leases were not put back",
            )
            assert not await pair.redis.hexists(pair.queues.keys.schedulers, "ghost")
            for task_id in lost:  # (the PENDING records are written off the hot path: a moment later)
                await eventually(lambda t=task_id: _put_back_recorded(pair, t), 5, "put-back not recorded")
                history = await pair.pg.fetchval("SELECT history FROM tasks WHERE id = $1", uuid.UUID(task_id))
                [back] = [h for h in history if h["status"] == "PENDING" and "counted" in h]
                assert back["detail"] == "scheduler restart: replica ghost is gone" and back["counted"] is False
            entries = {e.task_id: e for e in await pair.queues.queued(MAC)}
            assert sorted(entries) == sorted(lost) and all(e.failures == 0 for e in entries.values())
            # And the live replica's lease is left alone
            facts = await pair.queues.lease_facts([kept.task_id])
            assert facts[kept.task_id].entry.attempt == lease_number(kept.lease_token)
            assert await pair.status(live) == "ASSIGNED"
        finally:
            talker.cancel()


async def _put_back_recorded(pair: Pair, task_id: str) -> bool:
    history = await pair.pg.fetchval("SELECT history FROM tasks WHERE id = $1", uuid.UUID(task_id))
    return any(h["status"] == "PENDING" and "counted" in h for h in history)


async def _none(value: object) -> bool:
    return not await value  # type: ignore[misc]


async def _true(value: bool) -> bool:
    return value
