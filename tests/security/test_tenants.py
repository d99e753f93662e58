"""Tenants cannot hurt each other: device ownership, priority entitlements, per-caller submit rates and pending
quotas, against the real Redis and PostgreSQL and real in-process intake servers with credentials (no anonymous
callers): alice and bob are clients, ops an operator, svc a client with its own policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from redis.asyncio import Redis

from intake_svc.ownership import DeviceOwners, Owner, Ownership
from intake_svc.server import build as build_intake
from scheduler_svc.rebuild import Rebuilder
from sieve import rpc
from sieve.db.tasks import TaskStore
from sieve.redis.queue_store import QueueStore
from sieve.rpc.auth import hash_token
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.redis import delete_prefix
from tests.support.tasks import PNG, text_spec

TOKENS = {
    "alice": ("client", "token-alice"),
    "bob": ("client", "token-bob"),
    "svc": ("client", "token-svc"),
    "ops": ("operator", "token-ops"),
}
A1, A2, B1 = "AA:BB:CC:00:00:01", "AA:BB:CC:00:00:02", "BB:BB:CC:00:00:01"


def as_(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name][1]}"),)


@dataclass
class Intake:
    """One or more intake replicas on loopback, sharing this test's Redis prefix and schema."""

    settings: Settings
    stubs: list[intake_pb2_grpc.IntakeServiceStub]
    queues: QueueStore
    pg: asyncpg.Pool
    redis: Redis

    @property
    def stub(self) -> intake_pb2_grpc.IntakeServiceStub:
        return self.stubs[0]

    async def submit(self, who: str, spec: intake_pb2.TaskSpec, replica: int = 0) -> intake_pb2.SubmitResponse:
        return await self.stubs[replica].Submit(intake_pb2.SubmitRequest(task=spec), metadata=as_(who))

    async def refused(self, who: str, spec: intake_pb2.TaskSpec, replica: int = 0) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await self.submit(who, spec, replica)
        return err.value

    async def batch(self, who: str, specs: list[intake_pb2.TaskSpec]) -> list[intake_pb2.SubmitBatchItem]:
        reply = await self.stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs), metadata=as_(who))
        return list(reply.items)

    async def tasks_of(self, who: str) -> int:
        return int(await self.pg.fetchval("SELECT count(*) FROM tasks WHERE caller = $1", who))


@asynccontextmanager
async def intake(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, replicas: int = 1, **overrides: object
) -> AsyncIterator[Intake]:
    credentials = ",".join(f"{name}:{role}:{hash_token(token)}" for name, (role, token) in TOKENS.items())
    settings = settings.replace(auth_tokens=credentials, allow_anonymous=False, **overrides)
    apps = [await build_intake(settings, Stores.of(redis=redis, pool=pg)) for _ in range(replicas)]
    servers = [await rpc.create_server(app.service, "127.0.0.1:0", settings) for app in apps]
    channels = [rpc.channel(f"127.0.0.1:{s.port}", settings) for s in servers]
    try:
        yield Intake(
            settings, [intake_pb2_grpc.IntakeServiceStub(c) for c in channels], QueueStore(redis, settings), pg, redis
        )
    finally:
        for channel in channels:
            await channel.close()
        for server in servers:
            await server.stop(1)


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None


# --- device ownership ---------------------------------------------------------------------------------
async def test_a_caller_cannot_submit_for_another_callers_device(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        # Given alice's first submit claimed her device
        await t.submit("alice", text_spec(A1, "mine"))
        # When bob submits for it (any spelling of the MAC)
        err = await t.refused("bob", text_spec("aa-bb-cc-00-00-01", "not yours"))
        # Then he is refused, told the device and not who owns it, and nothing of his is recorded
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert A1 in (err.details() or "") and "alice" not in (err.details() or "")
        info = error_info(err)
        assert info is not None and info.reason == "DEVICE_NOT_OWNED" and info.metadata["device"] == A1
        assert await t.tasks_of("bob") == 0
        assert [e.caller for e in await t.queues.queued(A1)] == ["alice"]
        # And in a batch only the item for alice's device is refused; bob's own device is his
        items = await t.batch("bob", [text_spec(B1, "b1"), text_spec(A1, "a1"), text_spec(B1, "b2")])
        assert [i.code for i in items] == [0, grpc.StatusCode.PERMISSION_DENIED.value[0], 0]
        assert A1 in items[1].message and "alice" not in items[1].message
        assert not items[1].HasField("task")
        assert await t.tasks_of("bob") == 2
        assert len(await t.queues.queued(A1)) == 1
        # and the owners are on record
        owner = await t.stub.GetDeviceOwner(intake_pb2.GetDeviceOwnerRequest(device_id=B1), metadata=as_("ops"))
        assert (owner.owner.device_id, owner.owner.caller, owner.owner.assigned_by) == (B1, "bob", "")


async def test_a_caller_cannot_exhaust_overload_or_back_off_another_callers_device(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, max_per_device_pending=3) as t:
        await t.submit("alice", text_spec(A1, "first"))
        # When bob floods alice's device (Submit, SubmitBatch) and sends it a task type nobody serves
        for i in range(5):
            assert (await t.refused("bob", text_spec(A1, f"flood {i}"))).code() == grpc.StatusCode.PERMISSION_DENIED
        items = await t.batch("bob", [text_spec(A1, f"flood {i}") for i in range(10)])
        assert {i.code for i in items} == {grpc.StatusCode.PERMISSION_DENIED.value[0]}
        ocr = intake_pb2.TaskSpec(device_id=A1, type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
        assert (await t.refused("bob", ocr)).code() == grpc.StatusCode.PERMISSION_DENIED
        # Then alice's device holds only her task, is not overloaded nor backed off, and she fills it herself
        meta = await t.queues.device_meta(A1)
        assert (meta["backlog"], meta["state"]) == ("1", "ready")
        assert not await redis.sismember(t.queues.keys.overloaded, A1)
        assert await redis.zscore(t.queues.keys.backoff, A1) is None
        for i in range(2):
            await t.submit("alice", text_spec(A1, f"more {i}"))
        assert (await t.refused("alice", text_spec(A1, "one too many"))).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await t.tasks_of("bob") == 0


async def test_an_operator_reassigns_a_device_and_every_replica_follows(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, replicas=2, device_owner_refresh_s=0.2) as t:
        # Given alice owns a device, known to both replicas
        await t.submit("alice", text_spec(A1, "a"), replica=0)
        await t.submit("alice", text_spec(A1, "b"), replica=1)
        assert (await t.refused("bob", text_spec(A1, "c"), replica=1)).code() == grpc.StatusCode.PERMISSION_DENIED
        # A client may neither re-assign a device nor ask who owns it
        for call, request in (
            (t.stub.AssignDevice, intake_pb2.AssignDeviceRequest(device_id=A1, caller="bob")),
            (t.stub.GetDeviceOwner, intake_pb2.GetDeviceOwnerRequest(device_id=A1)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(request, metadata=as_("bob"))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # When an operator gives it to bob through replica 0
        reply = await t.stub.AssignDevice(
            intake_pb2.AssignDeviceRequest(device_id="aabb.cc00.0001", caller="bob"), metadata=as_("ops")
        )
        assert (reply.owner.device_id, reply.owner.caller, reply.owner.assigned_by, reply.previous_caller) == (
            A1,
            "bob",
            "ops",
            "alice",
        )
        # Then bob may submit for it and alice may not, at once on replica 0 and within a few seconds on replica 1
        await t.submit("bob", text_spec(A1, "now mine"), replica=0)
        assert (await t.refused("alice", text_spec(A1, "x"), replica=0)).code() == grpc.StatusCode.PERMISSION_DENIED
        deadline = time.monotonic() + 10
        while True:
            try:
                await t.submit("bob", text_spec(A1, "via replica 1"), replica=1)
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
                assert time.monotonic() < deadline, "replica 1 never learnt of the re-assignment"
                await asyncio.sleep(0.1)
        assert (await t.refused("alice", text_spec(A1, "y"), replica=1)).code() == grpc.StatusCode.PERMISSION_DENIED
        owner = await t.stubs[1].GetDeviceOwner(intake_pb2.GetDeviceOwnerRequest(device_id=A1), metadata=as_("ops"))
        assert owner.owner.caller == "bob"
        # alice's earlier tasks are still hers (ownership decides who submits, not whose tasks they are)
        assert await t.tasks_of("alice") == 2
        # An operator submits for any device without claiming it
        await t.submit("ops", text_spec(A1, "operator's"))
        await t.submit("ops", text_spec(A2, "unowned"))
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await t.stub.GetDeviceOwner(intake_pb2.GetDeviceOwnerRequest(device_id=A2), metadata=as_("ops"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        await t.submit("alice", text_spec(A2, "first client claims it"))


async def test_bad_assignments_are_refused_naming_the_field(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with intake(settings, redis, pg) as t:
        for request, field in (
            (intake_pb2.AssignDeviceRequest(device_id="nope", caller="bob"), "device_id"),
            (intake_pb2.AssignDeviceRequest(device_id=A1, caller=""), "caller"),
            (intake_pb2.AssignDeviceRequest(device_id=A1, caller="a/b"), "caller"),
            (intake_pb2.AssignDeviceRequest(device_id=A1, caller="x" * 129), "caller"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await t.stub.AssignDevice(request, metadata=as_("ops"))
            assert (err.value.code(), rpc.bad_fields_of(err.value)) == (grpc.StatusCode.INVALID_ARGUMENT, [field])
        assert await pg.fetchval("SELECT count(*) FROM device_owners") == 0


async def test_concurrent_first_submits_give_a_device_one_owner(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, replicas=2) as t:
        outcomes = await asyncio.gather(
            *(t.submit(who, text_spec(A1, who), replica=i % 2) for i, who in enumerate(["alice", "bob"] * 4)),
            return_exceptions=True,
        )
        winners = {who for who, o in zip(["alice", "bob"] * 4, outcomes, strict=True) if not isinstance(o, Exception)}
        losers = [o for o in outcomes if isinstance(o, Exception)]
        assert len(winners) == 1 and len(losers) == 4
        assert all(
            isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.PERMISSION_DENIED for e in losers
        )
        assert await pg.fetchval("SELECT caller FROM device_owners WHERE device = $1", A1) == winners.pop()


# --- priorities -----------------------------------------------------------------------------------------
async def test_high_and_critical_priorities_are_entitlements(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, caller_policies="svc:priorities=HIGH") as t:
        for who, device in (("alice", A1), ("svc", A2)):
            await t.submit(who, text_spec(device, "normal"))
            await t.submit(who, text_spec(device, "low", priority=types_pb2.PRIORITY_LOW))
        # alice has no entitlement: HIGH and CRITICAL are refused naming the field
        for priority in (types_pb2.PRIORITY_HIGH, types_pb2.PRIORITY_CRITICAL):
            err = await t.refused("alice", text_spec(A1, "urgent", priority=priority))
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "task.priority" in (err.details() or "")
            info = error_info(err)
            assert info is not None and info.metadata["field"] == "task.priority"
        # svc may use HIGH, not CRITICAL; a batch refuses only the item naming its index
        await t.submit("svc", text_spec(A2, "high", priority=types_pb2.PRIORITY_HIGH))
        items = await t.batch(
            "svc",
            [
                text_spec(A2, "h", priority=types_pb2.PRIORITY_HIGH),
                text_spec(A2, "c", priority=types_pb2.PRIORITY_CRITICAL),
            ],
        )
        assert [i.code for i in items] == [0, grpc.StatusCode.PERMISSION_DENIED.value[0]]
        assert "tasks[1].priority" in items[1].message
        # an operator uses every priority
        await t.submit("ops", text_spec(A1, "critical", priority=types_pb2.PRIORITY_CRITICAL))
        assert await t.tasks_of("alice") == 2
        assert await pg.fetchval("SELECT count(*) FROM tasks WHERE caller = 'svc' AND priority = 5") == 0
        assert {e.priority for e in await t.queues.queued(A1)} == {3, 2, 5}


# --- submit rate --------------------------------------------------------------------------------------
async def test_the_token_bucket_refuses_with_a_retry_delay_that_works_when_honoured(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, caller_policies="alice:rate_per_s=4,burst=2") as t:
        # Given a bucket of 2 refilled at 4 tasks/s, spent by two submits
        await t.submit("alice", text_spec(A1, "1"))
        await t.submit("alice", text_spec(A1, "2"))
        # When alice submits a third at once, she is refused with when to come back
        err = await t.refused("alice", text_spec(A1, "3"))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        delay = rpc.retry_delay_of(err)
        assert delay is not None and 0 < delay <= 0.3
        # while bob, with the generous default rate, is not affected
        for i in range(5):
            await t.submit("bob", text_spec(B1, f"b{i}"))
        # Then honouring the delay is enough
        await asyncio.sleep(delay)
        await t.submit("alice", text_spec(A1, "3 again"))
        # and a batch gets the tokens there are: the first items in, the rest told when
        await asyncio.sleep(0.6)  # the bucket is full again (2)
        items = await t.batch("alice", [text_spec(A1, f"b{i}") for i in range(5)])
        assert [i.code for i in items[:2]] == [0, 0]
        assert {i.code for i in items[2:]} == {grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]}
        wait = items[2].retry_after.ToMilliseconds() / 1000
        assert 0 < wait <= 0.6  # two tokens (the bucket's size) at 4/s
        assert await t.tasks_of("alice") == 5


async def test_the_bucket_refills_at_its_rate(redis: Redis, settings: Settings) -> None:
    queues = QueueStore(redis, settings)
    t0 = 1_700_000_000_000
    assert await queues.take_tokens("c", 3, rate_per_s=10, burst=5, now=t0) == (3, 0)
    assert await queues.take_tokens("c", 5, rate_per_s=10, burst=5, now=t0) == (2, 0.3)  # 3 more at 10/s
    assert await queues.take_tokens("c", 1, rate_per_s=10, burst=5, now=t0 + 50) == (0, 0.05)
    assert await queues.take_tokens("c", 1, rate_per_s=10, burst=5, now=t0 + 100) == (1, 0)
    # never more than the burst, however long it waited; a refused rest waits for at most a full bucket
    assert await queues.take_tokens("c", 9, rate_per_s=10, burst=5, now=t0 + 3_600_000) == (5, 0.4)
    assert await queues.take_tokens("c", 12, rate_per_s=10, burst=5, now=t0 + 7_200_000) == (5, 0.5)
    # the key expires once the bucket would be full again
    assert 0 < await redis.pttl(queues.keys.submit_bucket("c")) <= 500 + 1000


# --- pending quota ----------------------------------------------------------------------------------
async def test_a_callers_pending_quota_refuses_it_while_another_caller_still_gets_in(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, caller_policies="alice:max_pending=3") as t:
        ids = [(await t.submit("alice", text_spec(A1 if i % 2 else A2, f"a{i}"))).task.task_id for i in range(3)]
        err = await t.refused("alice", text_spec(A1, "over"))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert 0 < (rpc.retry_delay_of(err) or 0) <= settings.retry_after_s  # jittered, from the drain rate
        assert "pending limit" in (err.details() or "")
        # her devices are not marked overloaded for it (the quota is hers, not theirs)
        assert not await redis.sismember(t.queues.keys.overloaded, A1)
        items = await t.batch("alice", [text_spec(A1, "x"), text_spec(A2, "y")])
        assert {i.code for i in items} == {grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]}
        # bob still gets in
        await t.submit("bob", text_spec(B1, "b"))
        assert await t.queues.caller_open(["alice", "bob"]) == {"alice": 3, "bob": 1}
        # once one of alice's tasks is final she has room again
        await t.stub.CancelTask(intake_pb2.CancelTaskRequest(task_id=ids[0]), metadata=as_("alice"))
        assert await t.queues.caller_open(["alice"]) == {"alice": 2}
        await t.submit("alice", text_spec(A1, "room again"))
        assert await t.tasks_of("alice") == 4


async def test_by_default_one_caller_cannot_fill_the_global_limit_alone(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, max_total_pending=10) as t:
        # the default quota is a fraction (0.8) of the global limit
        items = await t.batch("alice", [text_spec(A1, f"a{i}") for i in range(8)])
        assert {i.code for i in items} == {0}
        err = await t.refused("alice", text_spec(A2, "greedy"))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "pending limit" in (err.details() or "")
        for i in range(2):
            await t.submit("bob", text_spec(B1, f"b{i}"))
        # now the global limit is reached, for everyone
        assert (await t.refused("bob", text_spec(B1, "b2"))).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await t.queues.pending() == 10


# --- Redis lost its memory ----------------------------------------------------------------------------
async def test_a_rebuild_restores_the_callers_counts_and_ownership_still_holds(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, caller_policies="alice:max_pending=4") as t:
        await t.batch("alice", [text_spec(A1, f"a{i}") for i in range(3)])
        await t.batch("bob", [text_spec(B1, f"b{i}") for i in range(2)])
        assert await t.queues.caller_open() == {"alice": 3, "bob": 2}
        # When Redis loses its memory and a scheduler rebuilds it from PostgreSQL
        await delete_prefix(redis, t.settings.redis_prefix)
        assert await Rebuilder(t.queues, TaskStore(pg)).ensure()
        # Then every caller's count is back, and so are its quota and its devices
        assert await t.queues.caller_open() == {"alice": 3, "bob": 2}
        assert {e.caller for e in await t.queues.queued(A1)} == {"alice"}
        await t.submit("alice", text_spec(A1, "fourth"))
        assert (await t.refused("alice", text_spec(A1, "fifth"))).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await t.refused("bob", text_spec(A1, "still not his"))).code() == grpc.StatusCode.PERMISSION_DENIED
        assert (await t.refused("alice", text_spec(B1, "nor hers"))).code() == grpc.StatusCode.PERMISSION_DENIED


async def test_known_devices_cost_no_round_trip_and_reassignments_reach_every_cache(pg: asyncpg.Pool) -> None:
    # Given two replicas' views of the owners
    first, second = Ownership(DeviceOwners(pg), refresh_s=0.2), Ownership(DeviceOwners(pg), refresh_s=0.2)
    assert await first.owners([A1, A2], claim_for="alice") == {A1: "alice", A2: "alice"}
    assert await second.owners([A1, B1], claim_for="bob") == {A1: "alice", B1: "bob"}
    assert (first.lookups, second.lookups) == (1, 1)
    # When they are asked again about devices they know, nothing is read (the refresh aside)
    for _ in range(20):
        assert await first.owners([A2, A1], claim_for="alice") == {A2: "alice", A1: "alice"}
    assert first.lookups == 1
    # When an operator gives A1 to bob through the first, the second follows within its refresh interval
    owner, previous = await first.assign(A1, "bob", "ops")
    assert (owner.caller, owner.assigned_by, previous) == ("bob", "ops", "alice")
    assert (await first.owners([A1], claim_for="alice"))[A1] == "bob"
    await asyncio.sleep(0.3)
    assert (await second.owners([A1], claim_for="alice"))[A1] == "bob"
    assert second.lookups == 1  # learnt from the refresh, not by a lookup
    # and a lookup that read the old owner before the re-assignment cannot put it back (higher version wins)
    second._remember([Owner(A1, "alice", 0)])
    assert (await second.owners([A1], claim_for=None))[A1] == "bob"
