"""The audit log: operator calls, refused attempts at them and operators' cross-tenant reads, recorded in
PostgreSQL with who, what, when, from where and how it ended, and listed by operators only.

Real servers with authentication on (`auth_stack.secure_stack`), real PostgreSQL (the test's own schema),
credentials made here: an operator `ops`, clients `alice` and `bob`, a worker `w1`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from google.protobuf import timestamp_pb2
from redis.asyncio import Redis

from sieve import rpc
from sieve.db.audit import BadPageToken, decode_page_token, encode_page_token
from sieve.rpc.audit import MAX_TARGET_CHARS, describe_request
from sieve.settings import Settings
from sieve.v1 import intake_pb2, registry_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.integration.pull_client import ScriptedWorker
from tests.security.auth_stack import Credentials, SecureStack, eventually, secure_stack, text

SCHED = "/sieve.v1.SchedulerService/"
INTAKE = "/sieve.v1.IntakeService/"


@pytest.fixture
def credentials() -> Credentials:
    creds = Credentials()
    creds.add("ops", "operator")
    creds.add("alice", "client")
    creds.add("bob", "client")
    creds.add("w1", "worker")
    return creds


@pytest.fixture
async def stack(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials
) -> AsyncIterator[SecureStack]:
    async with secure_stack(settings, redis, pg, credentials, max_attempts=1) as s:
        yield s


async def rows(pg: asyncpg.Pool, where: str = "true", *args: object) -> list[asyncpg.Record]:
    return await pg.fetch(f"SELECT * FROM audit_events WHERE {where} ORDER BY id", *args)


def is_loopback_peer(peer: str) -> bool:
    return peer.startswith(("ipv4:127.0.0.1:", "ipv6:[::1]:"))


async def dead_letter(stack: SecureStack, credentials: Credentials, device: str) -> str:
    """A task of alice's that fails its only attempt (max_attempts=1) and is dead-lettered."""
    alice = stack.intake(credentials.tokens["alice"])
    task_id = (await alice.Submit(intake_pb2.SubmitRequest(task=text(device, "hello")), timeout=5)).task.task_id
    await stack.register("w1", credentials.tokens["w1"], concurrency=4)
    async with ScriptedWorker(
        stack.as_caller(credentials.tokens["w1"]),
        worker_id="w1",
        policy=lambda _: scheduler_pb2.Nack(reason="transient failure", count_attempt=True),
    ):
        await eventually(lambda: _status_is(stack, task_id, "DEAD_LETTERED"), 15, "task not dead-lettered")
    return task_id


async def _status_is(stack: SecureStack, task_id: str, status: str) -> bool:
    return await stack.status(task_id) == status


# --- operator actions --------------------------------------------------------------------------------------
async def test_operator_actions_are_recorded_with_who_what_when_peer_and_outcome(
    stack: SecureStack, credentials: Credentials
) -> None:
    task_id = await dead_letter(stack, credentials, "AA-BB-CC-DD-EE-01")
    ops = stack.scheduler_stub(credentials.tokens["ops"])
    before = datetime.now(UTC) - timedelta(seconds=1)

    # When an operator looks at the watermark, lists, requeues by id, tries an unfiltered purge without all=true
    # (refused by the handler: INVALID_ARGUMENT) and purges with a filter
    await ops.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=5)
    listed = await ops.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest(limit=5), timeout=5)
    assert [d.task_id for d in listed.dead_letters] == [task_id]
    requeued = await ops.RequeueDeadLetters(
        scheduler_pb2.RequeueDeadLettersRequest(filter=scheduler_pb2.DeadLetterFilter(task_id=task_id)), timeout=5
    )
    assert list(requeued.task_ids) == [task_id]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ops.PurgeDeadLetters(scheduler_pb2.PurgeDeadLettersRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await ops.PurgeDeadLetters(
        scheduler_pb2.PurgeDeadLettersRequest(filter=scheduler_pb2.DeadLetterFilter(device_id="AA:BB:CC:DD:EE:09")),
        timeout=5,
    )
    after = datetime.now(UTC) + timedelta(seconds=1)

    # Then each call is one row, written before its answer came back
    found = await rows(stack.pg, "kind = 'operator'")
    assert [(r["method"], r["outcome"]) for r in found] == [
        (SCHED + "GetWatermark", "OK"),
        (SCHED + "ListDeadLetters", "OK"),
        (SCHED + "RequeueDeadLetters", "OK"),
        (SCHED + "PurgeDeadLetters", "INVALID_ARGUMENT"),
        (SCHED + "PurgeDeadLetters", "OK"),
    ]
    for r in found:
        assert (r["principal"], list(r["roles"]), r["tenant"]) == ("ops", ["operator"], None)
        assert is_loopback_peer(r["peer"]), r["peer"]
        assert before <= r["at"] <= after and r["duration_ms"] >= 0
    watermark, listing, requeue, bad_purge, purge = found
    assert watermark["target"] == "" and listing["target"] == '{"limit":5}'
    assert requeue["target"] == '{"filter":{"task_id":"' + task_id + '"}}'
    assert "all" in bad_purge["detail"] and purge["detail"] == ""
    assert purge["target"] == '{"filter":{"device_id":"AA:BB:CC:DD:EE:09"}}'


# --- cross-tenant reads ------------------------------------------------------------------------------------
async def test_an_operators_get_and_cancel_of_another_callers_task_are_recorded_and_own_reads_are_not(
    stack: SecureStack, credentials: Credentials
) -> None:
    alice = stack.intake(credentials.tokens["alice"])
    ops = stack.intake(credentials.tokens["ops"])
    bob = stack.intake(credentials.tokens["bob"])
    task_id = (
        await alice.Submit(intake_pb2.SubmitRequest(task=text("AA-BB-CC-DD-EE-02", "hi")), timeout=5)
    ).task.task_id
    own = (await ops.Submit(intake_pb2.SubmitRequest(task=text("AA-BB-CC-DD-EE-03", "mine")), timeout=5)).task.task_id

    # When alice reads her task, bob tries to (NOT_FOUND), and the operator reads its own task and alice's,
    # then cancels alice's
    await alice.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await bob.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    await ops.GetTask(intake_pb2.GetTaskRequest(task_id=own), timeout=5)
    seen = (await ops.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)).task
    assert seen.task_id == task_id
    await ops.CancelTask(intake_pb2.CancelTaskRequest(task_id=task_id), timeout=5)

    # Then exactly the operator's two accesses to alice's task are recorded, naming alice as the tenant
    found = await rows(stack.pg)
    assert [(r["kind"], r["method"], r["principal"], r["tenant"], r["target"], r["outcome"]) for r in found] == [
        ("cross_tenant", INTAKE + "GetTask", "ops", "alice", f"task {task_id}", "OK"),
        ("cross_tenant", INTAKE + "CancelTask", "ops", "alice", f"task {task_id}", "OK"),
    ]
    assert all(is_loopback_peer(r["peer"]) and list(r["roles"]) == ["operator"] for r in found)
    assert await stack.status(task_id) == "CANCELLED"


# --- refused attempts --------------------------------------------------------------------------------------
async def test_refused_attempts_at_operator_rpcs_are_recorded_and_change_nothing(
    stack: SecureStack, credentials: Credentials
) -> None:
    task_id = await dead_letter(stack, credentials, "AA-BB-CC-DD-EE-04")
    addr = stack.addresses["scheduler"]

    # When a client tries to purge every dead letter, a worker to list the audit log, a caller without a
    # credential to requeue, and one with an unknown token to read the watermark
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.scheduler_stub(credentials.tokens["alice"]).PurgeDeadLetters(
            scheduler_pb2.PurgeDeadLettersRequest(all=True), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.scheduler_stub(credentials.tokens["w1"]).ListAuditEvents(
            scheduler_pb2.ListAuditEventsRequest(), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with grpc.aio.insecure_channel(addr) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await scheduler_pb2_grpc.SchedulerServiceStub(ch).RequeueDeadLetters(
                scheduler_pb2.RequeueDeadLettersRequest(all=True), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await scheduler_pb2_grpc.SchedulerServiceStub(ch).GetWatermark(
                scheduler_pb2.GetWatermarkRequest(), metadata=(("authorization", "Bearer sv_not-a-token"),), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # Then each attempt is recorded (in the background, batched), naming the credential when it was a valid one
    async def four() -> bool:
        return len(await rows(stack.pg, "kind = 'refused'")) >= 4

    await eventually(four, 10, "refused attempts not recorded")
    found = await rows(stack.pg, "kind = 'refused'")
    got = {(r["method"], r["principal"], tuple(r["roles"]), r["outcome"], r["target"]) for r in found}
    assert got == {
        (SCHED + "PurgeDeadLetters", "alice", ("client",), "PERMISSION_DENIED", '{"all":true}'),
        (SCHED + "ListAuditEvents", "w1", ("worker",), "PERMISSION_DENIED", ""),
        (SCHED + "RequeueDeadLetters", "", (), "UNAUTHENTICATED", '{"all":true}'),
        (SCHED + "GetWatermark", "", (), "UNAUTHENTICATED", ""),
    }
    assert all(is_loopback_peer(r["peer"]) for r in found)
    assert any("operator" in r["detail"] for r in found if r["outcome"] == "PERMISSION_DENIED")
    # and nothing was done: the dead letter is still there, nothing counts as an operator action
    assert await stack.status(task_id) == "DEAD_LETTERED"
    assert await rows(stack.pg, "kind = 'operator'") == []


async def test_calls_of_clients_and_workers_to_their_own_rpcs_are_not_audited(
    stack: SecureStack, credentials: Credentials
) -> None:
    alice = stack.intake(credentials.tokens["alice"])
    task_id = (
        await alice.Submit(intake_pb2.SubmitRequest(task=text("AA-BB-CC-DD-EE-05", "x")), timeout=5)
    ).task.task_id
    await alice.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)
    await stack.register("w1", credentials.tokens["w1"], concurrency=2)
    await asyncio.sleep(0.3)
    assert await rows(stack.pg) == []


# --- listing -----------------------------------------------------------------------------------------------
async def test_operators_list_the_log_newest_first_with_filters_and_pages(
    stack: SecureStack, credentials: Credentials
) -> None:
    ops = stack.scheduler_stub(credentials.tokens["ops"])
    alice = stack.scheduler_stub(credentials.tokens["alice"])
    for _ in range(3):
        await ops.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=5)
    await ops.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest(), timeout=5)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.01)
    await ops.PurgeDeadLetters(
        scheduler_pb2.PurgeDeadLettersRequest(
            filter=scheduler_pb2.DeadLetterFilter(task_id="00000000-0000-0000-0000-000000000000")
        ),
        timeout=5,
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await alice.PurgeDeadLetters(scheduler_pb2.PurgeDeadLettersRequest(all=True), timeout=5)
    await eventually(lambda: _count(stack, "kind = 'refused'", 1), 10, "refusal not recorded")

    def listing(**kw: object) -> scheduler_pb2.ListAuditEventsRequest:
        return scheduler_pb2.ListAuditEventsRequest(**kw)  # type: ignore[arg-type]

    # everything, newest first (the listing calls themselves are recorded after they answer)
    events = (await ops.ListAuditEvents(listing(), timeout=5)).events
    assert [e.method.rsplit("/", 1)[1] for e in events] == [
        "PurgeDeadLetters",
        "PurgeDeadLetters",
        "ListDeadLetters",
        "GetWatermark",
        "GetWatermark",
        "GetWatermark",
    ]
    assert events[0].kind == scheduler_pb2.AUDIT_KIND_REFUSED and events[0].principal == "alice"
    assert events[1].kind == scheduler_pb2.AUDIT_KIND_OPERATOR and list(events[1].roles) == ["operator"]
    assert all(e.id and e.at.seconds and e.peer for e in events)
    ids = [e.id for e in events]
    assert ids == sorted(ids, reverse=True)

    # filters: principal, method (full or short), kind, outcome, before
    assert {e.principal for e in (await ops.ListAuditEvents(listing(principal="alice"))).events} == {"alice"}
    short = (await ops.ListAuditEvents(listing(method="GetWatermark"))).events
    full = (await ops.ListAuditEvents(listing(method=SCHED + "GetWatermark"))).events
    assert len(short) == 3 and [e.id for e in short] == [e.id for e in full]
    assert (await ops.ListAuditEvents(listing(method="Watermark"))).events == []
    refused = (await ops.ListAuditEvents(listing(kind=scheduler_pb2.AUDIT_KIND_REFUSED))).events
    assert [e.outcome for e in refused] == ["PERMISSION_DENIED"]
    denied = (await ops.ListAuditEvents(listing(outcome="permission_denied"))).events
    assert [e.id for e in denied] == [e.id for e in refused]
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(middle)
    older = (await ops.ListAuditEvents(listing(before=stamp, method="ListDeadLetters"))).events
    assert len(older) == 1
    early = (await ops.ListAuditEvents(listing(before=stamp))).events
    assert {e.method.rsplit("/", 1)[1] for e in early} >= {"GetWatermark", "ListDeadLetters"}
    assert "PurgeDeadLetters" not in {e.method.rsplit("/", 1)[1] for e in early}

    # pages of two cover everything once, in order, while new events (these listings) arrive meanwhile
    cut = _now_stamp()
    everything = [e.id for e in (await ops.ListAuditEvents(listing(limit=1000, before=cut))).events]
    assert len(everything) >= 7
    paged: list[int] = []
    token = ""
    while True:
        page = await ops.ListAuditEvents(listing(limit=2, page_token=token, before=cut))
        paged += [e.id for e in page.events]
        token = page.next_page_token
        if not token:
            break
        assert len(page.events) == 2
    assert paged == everything


async def _count(stack: SecureStack, where: str, n: int) -> bool:
    return len(await rows(stack.pg, where)) >= n


def _now_stamp() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.now(UTC))
    return stamp


async def test_bad_listing_requests_are_invalid_argument_naming_the_field(
    stack: SecureStack, credentials: Credentials
) -> None:
    ops = stack.scheduler_stub(credentials.tokens["ops"])
    cases = {
        "limit": scheduler_pb2.ListAuditEventsRequest(limit=1001),
        "kind": scheduler_pb2.ListAuditEventsRequest(kind=42),  # type: ignore[arg-type]
        "page_token": scheduler_pb2.ListAuditEventsRequest(page_token="not-a-token"),
        "principal": scheduler_pb2.ListAuditEventsRequest(principal="x" * 300),
        "before": scheduler_pb2.ListAuditEventsRequest(before=timestamp_pb2.Timestamp(seconds=10**12)),
    }
    for name, request in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ops.ListAuditEvents(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert rpc.bad_fields_of(err.value) == [name]
    # a limit of 1000 is fine, and the refused listings were operator calls that ended INVALID_ARGUMENT
    await ops.ListAuditEvents(scheduler_pb2.ListAuditEventsRequest(limit=1000), timeout=5)
    outcomes = [r["outcome"] for r in await rows(stack.pg, "method = $1", SCHED + "ListAuditEvents")]
    assert outcomes == ["INVALID_ARGUMENT"] * len(cases) + ["OK"]


async def test_clients_and_workers_cannot_list_the_audit_log(stack: SecureStack, credentials: Credentials) -> None:
    for name in ("alice", "w1"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.scheduler_stub(credentials.tokens[name]).ListAuditEvents(
                scheduler_pb2.ListAuditEventsRequest(principal=name), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name


# --- failures of the log itself ----------------------------------------------------------------------------
async def test_an_audit_write_that_fails_is_logged_and_does_not_fail_the_call(
    stack: SecureStack, credentials: Credentials, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an audit table that cannot take rows (a real PostgreSQL error: the table is gone)
    await stack.pg.execute("ALTER TABLE audit_events RENAME TO audit_events_away")
    ops = stack.scheduler_stub(credentials.tokens["ops"])
    with caplog.at_level(logging.WARNING, logger="sieve.rpc.audit"):
        # When an operator acts, the call still succeeds
        reply = await ops.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=10)
    assert reply.at.seconds > 0
    # Then the failure is logged with the event
    failed = [r for r in caplog.records if r.name == "sieve.rpc.audit" and "audit write failed" in r.getMessage()]
    assert failed and "GetWatermark" in failed[0].getMessage() and "'ops'" in failed[0].getMessage()
    await stack.pg.execute("ALTER TABLE audit_events_away RENAME TO audit_events")


async def test_the_registrys_operator_rpc_is_audited_in_its_log(
    stack: SecureStack, credentials: Credentials, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="sieve.rpc.audit"):
        await stack.registry(credentials.tokens["ops"]).ListWorkers(registry_pb2.ListWorkersRequest(), timeout=5)
    entries = [getattr(r, "audit", None) for r in caplog.records if r.name == "sieve.rpc.audit"]
    entries = [e for e in entries if e]
    assert [(e["kind"], e["method"], e["principal"], e["outcome"]) for e in entries] == [
        ("operator", "/sieve.v1.RegistryService/ListWorkers", "ops", "OK")
    ]
    assert is_loopback_peer(entries[0]["peer"])
    assert await rows(stack.pg) == []  # the registry holds no PostgreSQL credentials


# --- pieces ------------------------------------------------------------------------------------------------
def test_page_tokens_round_trip_and_foreign_ones_are_refused() -> None:
    at = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert decode_page_token(encode_page_token(at, 42)) == (at, 42)
    for bad in ("", "!!!", "bm90LWEtdG9rZW4", encode_page_token(at, 1)[:-3] + "@@@"):
        with pytest.raises(BadPageToken):
            decode_page_token(bad)


def test_a_request_is_described_as_compact_sorted_json_and_truncated() -> None:
    request = scheduler_pb2.RequeueDeadLettersRequest(
        filter=scheduler_pb2.DeadLetterFilter(error_contains="x" * 5000, device_id="AA:BB:CC:DD:EE:01"), all=True
    )
    described = describe_request(request)
    assert described.startswith('{"all":true,"filter":{"device_id":"AA:BB:CC:DD:EE:01","error_contains":"xxx')
    assert len(described) == MAX_TARGET_CHARS
    assert describe_request(scheduler_pb2.GetWatermarkRequest()) == ""
    assert describe_request(iter(())) == ""


async def test_a_flood_of_refused_attempts_is_rate_limited_and_summed_up(stack: SecureStack) -> None:
    # When a caller without a credential hammers an operator RPC
    async with grpc.aio.insecure_channel(stack.addresses["scheduler"]) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)

        async def attempt() -> grpc.StatusCode:
            try:
                await stub.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        codes = await asyncio.gather(*(attempt() for _ in range(500)))
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}

    # Then every attempt is accounted for: one row each up to the burst, the rest counted in summary rows
    async def accounted() -> int:
        found = await rows(stack.pg, "kind = 'refused'")
        return sum(1 if r["outcome"] != "DROPPED" else int(r["target"].split()[0]) for r in found)

    async def all_accounted() -> bool:
        return await accounted() >= 500

    await eventually(all_accounted, 15, "refused attempts not accounted for")
    found = await rows(stack.pg, "kind = 'refused'")
    single = [r for r in found if r["outcome"] == "UNAUTHENTICATED"]
    summaries = [r for r in found if r["outcome"] == "DROPPED"]
    assert await accounted() == 500
    assert 200 <= len(single) < 500 and summaries
    assert all(r["method"] == "*" and r["principal"] == "" for r in summaries)
