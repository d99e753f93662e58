"""Rogue workers against the scheduler's Pull stream and the registry, with authentication on.

Real intake, scheduler and registry servers in this process (`auth_stack.secure_stack`, no anonymous callers),
real workers under worker credentials, and rogue streams that send exactly what an attacker would (`RawPull`,
or the tests' `ScriptedWorker` where acking everything is the attack). What is asserted is what the queue and
PostgreSQL hold afterwards: a rogue takes nothing, settles nothing it does not hold, holds no more than its
registered concurrency, and cannot make a task disappear.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from sieve.settings import Settings
from sieve.v1 import intake_pb2, registry_pb2, scheduler_pb2, types_pb2
from tests.integration.pull_client import ScriptedWorker
from tests.security.auth_stack import Credentials, RawPull, SecureStack, eventually, secure_stack, text, wait_final

BOTH_TYPES = (types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE)


@pytest.fixture
def credentials() -> Credentials:
    creds = Credentials()
    for name, role in (
        ("alice", "client"),
        ("ops", "operator"),
        ("real", "worker"),
        ("w1", "worker"),
        ("w2", "worker"),
        ("liar", "worker"),
    ):
        creds.add(name, role)
    return creds


@pytest.fixture
async def stack(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials
) -> AsyncIterator[SecureStack]:
    async with secure_stack(settings, redis, pg, credentials) as s:
        yield s


async def submit(stack: SecureStack, count: int, devices: int = 3) -> list[str]:
    intake = stack.intake(stack.token("alice"))
    reply = await intake.SubmitBatch(
        intake_pb2.SubmitBatchRequest(
            tasks=[text(f"AA-BB-CC-DD-EE-{i % devices:02X}", f"task {i}") for i in range(count)]
        ),
        timeout=10,
    )
    ids = [item.task.task_id for item in reply.items]
    assert len(ids) == count and all(ids)
    return ids


def sessions_of(stack: SecureStack, worker_id: str) -> list[object]:
    return [s for s in stack.scheduler.board.sessions if s.worker_id == worker_id]


async def statuses(stack: SecureStack, ids: list[str]) -> Counter[str]:
    rows = await stack.pg.fetch("SELECT status FROM tasks WHERE id = ANY($1::uuid[])", ids)
    return Counter(r["status"] for r in rows)


# --- who may open a stream -------------------------------------------------------------------------------
async def test_a_rogue_stream_without_a_worker_credential_is_refused_and_receives_nothing(stack: SecureStack) -> None:
    ids = await submit(stack, 6)
    rogues = {
        "no credential": (stack.as_caller(""), grpc.StatusCode.UNAUTHENTICATED),
        "unknown token": (stack.as_caller("sv_" + "A" * 43), grpc.StatusCode.UNAUTHENTICATED),
        "client credential": (stack.as_("alice"), grpc.StatusCode.PERMISSION_DENIED),
        "operator credential": (stack.as_("ops"), grpc.StatusCode.PERMISSION_DENIED),
    }
    for what, (caller, code) in rogues.items():
        # (a stream the server ends before the client's first message is written can read INTERNAL on this side,
        # grpc/grpc#36066: such a stream is opened again, up to three times; none may receive anything)
        for _ in range(3):
            async with RawPull.hello(caller, "rogue", credits=100_000, gpu=True, task_types=BOTH_TYPES) as rogue:
                seen = await rogue.refused()
            assert rogue.received == [], what
            if seen != grpc.StatusCode.INTERNAL:
                break
        assert seen == code, what
        # the tests' scripted worker, which acks whatever it gets, fares no better
        for _ in range(3):
            async with ScriptedWorker(
                caller, worker_id="rogue", gpu=True, credits=100_000, task_types=BOTH_TYPES
            ) as scripted:
                await eventually(lambda w=scripted: _is_set(w.error), 5, f"{what}: scripted stream not refused")
            assert scripted.received == [], what
            if scripted.error.code() != grpc.StatusCode.INTERNAL:
                break
        assert scripted.error.code() == code, what
    # the queue keeps its tasks, untouched
    assert await stack.scheduler.queues.pending() == 6
    assert await statuses(stack, ids) == Counter({"PENDING": 6})
    assert not stack.scheduler.board.sessions


async def _is_set(value: object) -> bool:
    return value is not None


async def test_a_worker_credential_cannot_act_as_another_worker_id(stack: SecureStack) -> None:
    await submit(stack, 3)
    await stack.register("w2", stack.token("w2"), concurrency=4)
    w1 = stack.as_("w1")
    # a stream as another worker, or as an id that merely starts with its name, is refused
    for worker_id in ("w2", "w1x", "w", "real", "w2/w1"):
        async with RawPull.hello(w1, worker_id, credits=100) as rogue:
            assert await rogue.refused() == grpc.StatusCode.PERMISSION_DENIED, worker_id
        assert rogue.received == [], worker_id
    # and so are Register and Heartbeat as another worker: w2's record stays as w2 wrote it
    registry = stack.registry(stack.token("w1"))
    for worker_id in ("w2", "w1x"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await registry.Register(
                registry_pb2.RegisterRequest(
                    worker_id=worker_id, task_types=[types_pb2.TASK_TYPE_TEXT], concurrency=200
                ),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, worker_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await registry.Heartbeat(registry_pb2.HeartbeatRequest(worker_id=worker_id), timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, worker_id
    record = await stack.scheduler.streams.records.get("w2")
    assert record is not None and record.concurrency == 4
    assert await stack.scheduler.streams.records.get("w1x") is None
    # its own ids (N and N/...) are allowed
    await stack.register("w1/replica-1", stack.token("w1"), concurrency=1)
    async with RawPull.hello(w1, "w1/replica-1", credits=1) as own:
        await own.wait_for(1)
    assert own.error is None


async def test_a_stream_keeps_the_worker_id_of_its_first_hello(stack: SecureStack) -> None:
    await stack.register("w1", stack.token("w1"), concurrency=2)
    async with RawPull.hello(stack.as_("w1"), "w1") as stream:
        await eventually(lambda: _true(bool(sessions_of(stack, "w1"))), 5, "w1's stream did not open")
        # a later hello naming another worker does not turn the stream into that worker
        stream.send(
            scheduler_pb2.PullRequest(
                hello=scheduler_pb2.WorkerHello(worker_id="w2", task_types=[types_pb2.TASK_TYPE_TEXT]), credits=2
            )
        )
        await asyncio.sleep(0.5)
        assert not sessions_of(stack, "w2")
        ids = await submit(stack, 2)
        await asyncio.sleep(0.5)
    assert stream.received == [] or {a.task_id for a in stream.received} <= set(ids)
    assert not sessions_of(stack, "w2")


async def _true(value: bool) -> bool:
    return value


# --- settling leases -----------------------------------------------------------------------------------
@pytest.mark.parametrize("thief_id", ["w2", "w1"], ids=["another worker", "a second stream of the same worker"])
async def test_a_worker_cannot_ack_or_nack_another_streams_lease(stack: SecureStack, thief_id: str) -> None:
    for name in ("w1", "w2"):
        await stack.register(name, stack.token(name), concurrency=1)
    [task_id] = await submit(stack, 1)
    protocol = stack.scheduler.streams
    async with RawPull.hello(stack.as_("w1"), "w1", credits=1) as owner:
        [assignment] = await owner.wait_for(1)
        token = assignment.lease_token
        [session] = sessions_of(stack, "w1")
        async with RawPull.hello(stack.as_(thief_id), thief_id) as thief:
            streams = 2 if thief_id == "w1" else 1
            await eventually(
                lambda: _true(len(sessions_of(stack, thief_id)) == streams), 5, "the thief's stream did not open"
            )
            refused = protocol.fencing_refusals
            # When the other stream acks and nacks it with the real token (stolen), and with guesses
            thief.send(
                scheduler_pb2.PullRequest(
                    acks=[
                        scheduler_pb2.Ack(task_id=task_id, lease_token=token),
                        scheduler_pb2.Ack(task_id=task_id, lease_token=token.split(".")[0]),
                    ],
                    nacks=[
                        scheduler_pb2.Nack(task_id=task_id, lease_token=token, count_attempt=True, reason="stolen"),
                        scheduler_pb2.Nack(task_id=task_id, lease_token="", count_attempt=True),
                    ],
                )
            )
            await eventually(lambda: _true(protocol.fencing_refusals >= refused + 4), 5, "thief's settlements seen")
            # Then the owner's lease stays: it still holds the task, which is neither queued nor final
            assert task_id in session.held and session.tokens[task_id] == token
            assert await stack.scheduler.queues.pending() == 0
            assert await stack.status(task_id) in ("PENDING", "ASSIGNED", "RUNNING")
            assert thief.received == [] and thief.error is None
        # and the owner can still settle it with its own token (a nack: it goes back, uncounted)
        owner.send(
            scheduler_pb2.PullRequest(
                nacks=[scheduler_pb2.Nack(task_id=task_id, lease_token=token, reason="owner gives it back")]
            )
        )
        await eventually(lambda: _true(task_id not in session.held), 5, "the owner's nack was not honoured")
    # back in its queue with no failure counted: the thief's counted nack did not count either
    [entry] = await stack.scheduler.queues.queued("AA:BB:CC:DD:EE:00")
    assert entry.task_id == task_id and entry.failures == 0


async def test_a_guessed_lease_token_is_refused(stack: SecureStack) -> None:
    await stack.register("w1", stack.token("w1"), concurrency=1)
    ids = await submit(stack, 2, devices=1)
    streams = stack.scheduler.streams
    async with RawPull.hello(stack.as_("w1"), "w1", credits=1) as stream:
        [assignment] = await stream.wait_for(1)
        token = assignment.lease_token
        number = token.split(".")[0]
        other = next(i for i in ids if i != assignment.task_id)
        guesses = [
            number,
            "",
            f"{number}.",
            f"{number}.{'0' * 16}",
            f"{int(number) + 1}.{token.split('.')[1]}",
            token + "0",
            token[:-1],
            " " + token,
        ]
        refused = streams.fencing_refusals
        # When the stream settles its own task with guessed tokens, and the task it was not given with its token
        stream.send(
            scheduler_pb2.PullRequest(
                acks=[scheduler_pb2.Ack(task_id=assignment.task_id, lease_token=g) for g in guesses]
                + [scheduler_pb2.Ack(task_id=other, lease_token=token)]
            )
        )
        stream.send(
            scheduler_pb2.PullRequest(
                nacks=[
                    scheduler_pb2.Nack(task_id=assignment.task_id, lease_token=g, count_attempt=True) for g in guesses
                ]
            )
        )
        await eventually(
            lambda: _true(streams.fencing_refusals >= refused + 2 * len(guesses) + 1),
            5,
            "guessed settlements not all refused",
        )
        # Then nothing was settled: the task is still held, the other one still queued
        [session] = sessions_of(stack, "w1")
        assert session.tokens.get(assignment.task_id) == token
        assert await stack.status(assignment.task_id) in ("PENDING", "ASSIGNED", "RUNNING")
        assert await stack.status(other) == "PENDING"
        assert await stack.scheduler.queues.pending() == 1


# --- how much a stream may hold -----------------------------------------------------------------------
async def test_a_stream_with_100000_credits_holds_at_most_its_registered_concurrency(stack: SecureStack) -> None:
    await stack.register("w1", stack.token("w1"), concurrency=3)
    await submit(stack, 12)
    async with RawPull.hello(stack.as_("w1"), "w1", credits=100_000) as greedy:
        await greedy.wait_for(3)
        greedy.send(scheduler_pb2.PullRequest(credits=100_000))
        await asyncio.sleep(1.0)
        assert len(greedy.received) == 3
        [session] = sessions_of(stack, "w1")
        assert len(session.held) + session.credits <= 3
        # When it settles one, it gets one more, never more than three at once
        first = greedy.received[0]
        greedy.send(
            scheduler_pb2.PullRequest(
                nacks=[scheduler_pb2.Nack(task_id=first.task_id, lease_token=first.lease_token)], credits=100_000
            )
        )
        await greedy.wait_for(4)
        await asyncio.sleep(0.5)
        assert len(greedy.received) == 4 and len(session.held) == 3
    assert await stack.scheduler.queues.pending() == 12  # closing the stream put back what it held


async def test_an_authenticated_worker_that_never_registered_gets_nothing_until_it_registers(
    stack: SecureStack,
) -> None:
    await submit(stack, 5)
    async with RawPull.hello(stack.as_("w1"), "w1", credits=100_000) as stream:
        await asyncio.sleep(1.5)
        assert stream.received == [] and stream.error is None
        # When it registers (after its stream opened, as a worker whose Register lands late), the credits it
        # already sent count, up to the concurrency it registered
        await stack.register("w1", stack.token("w1"), concurrency=2)
        await stream.wait_for(2, timeout_s=10)
        await asyncio.sleep(0.5)
        assert len(stream.received) == 2


async def test_a_worker_that_acks_without_storing_results_does_not_make_tasks_disappear(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials
) -> None:
    async with secure_stack(
        settings, redis, pg, credentials, retry_backoff_base_s=0.05, retry_backoff_max_s=0.2, max_attempts=50
    ) as s:
        token = credentials.tokens
        await s.register("liar", token["liar"], concurrency=5)
        intake = s.intake(token["alice"])
        reply = await intake.SubmitBatch(
            intake_pb2.SubmitBatchRequest(tasks=[text(f"AA-BB-CC-DD-EE-{i:02X}", f"task {i}") for i in range(5)]),
            timeout=10,
        )
        ids = [item.task.task_id for item in reply.items]
        # Given a worker that acks every assignment at once, storing nothing
        async with ScriptedWorker(s.as_caller(token["liar"]), worker_id="liar", credits=5) as liar:
            # Then every task is handed out again (its ack did not remove it)
            await eventually(
                lambda: _true(
                    all(n >= 2 for n in Counter(a.task_id for a in liar.received).values())
                    and len({a.task_id for a in liar.received}) == 5
                ),
                15,
                "acked tasks were not handed out again",
            )
        assert liar.error is None
        assert s.scheduler.streams.unproven_acks >= 5
        counts = await statuses(s, ids)
        assert not counts["SUCCEEDED"] and sum(counts.values()) == 5
        # And a real worker then finishes every one of them
        await s.add_worker("real", token["real"])
        finals = [await wait_final(intake, task_id) for task_id in ids]
        assert [t.status for t in finals] == [types_pb2.TASK_STATUS_SUCCEEDED] * 5
        assert await s.pg.fetchval("SELECT count(*) FROM results WHERE task_id = ANY($1::uuid[])", ids) == 5


# --- the original attack ---------------------------------------------------------------------------------
async def test_an_unauthenticated_gpu_rogue_with_100000_credits_beside_a_real_worker_takes_nothing(
    stack: SecureStack,
) -> None:
    # Given one real worker, and a rogue that keeps trying to pull as a GPU worker with 100 000 credits
    await stack.add_worker("real", stack.token("real"))
    taken: list[scheduler_pb2.Assignment] = []
    refusals: list[grpc.StatusCode] = []
    stop = asyncio.Event()

    async def rogue() -> None:
        while not stop.is_set():
            async with RawPull.hello(
                stack.as_caller(""), "real", credits=100_000, gpu=True, task_types=BOTH_TYPES
            ) as r:
                refusals.append(await r.refused())
            taken.extend(r.received)
            await asyncio.sleep(0.05)

    attacker = asyncio.create_task(rogue())
    try:
        ids = await submit(stack, 30)
        intake = stack.intake(stack.token("alice"))
        # Then every task succeeds, and the rogue took none
        finals = [await wait_final(intake, task_id) for task_id in ids]
    finally:
        stop.set()
        await attacker
    assert [t.status for t in finals] == [types_pb2.TASK_STATUS_SUCCEEDED] * 30
    assert taken == []
    # (a stream refused before its first message was written may read INTERNAL here: grpc/grpc#36066)
    assert grpc.StatusCode.UNAUTHENTICATED in refusals
    assert set(refusals) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INTERNAL}
    assert {s.worker_id for s in stack.scheduler.board.sessions} == {"real"}


# --- revocation ------------------------------------------------------------------------------------------
async def test_revoking_a_worker_credential_ends_its_open_stream_and_what_it_held_goes_back(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials, tmp_path: Path
) -> None:
    path = tmp_path / "credentials"
    credentials.write(path)
    async with secure_stack(settings, redis, pg, Credentials(), auth_tokens_file=str(path)) as s:
        s.credentials = credentials
        await s.register("w1", s.token("w1"), concurrency=2)
        ids = await submit(s, 2, devices=1)
        async with RawPull.hello(s.as_("w1"), "w1", credits=2) as stream, RawPull.hello(s.as_("w2"), "w2") as bystander:
            await stream.wait_for(2)
            # When w1's entry is removed from the credentials file (w1 stops answering: a stolen token)
            kept = Credentials(lines=[line for line in credentials.lines if not line.startswith("w1:")])
            kept.write(path)
            # Then within a couple of seconds its stream ends UNAUTHENTICATED, and what it held goes back
            assert await stream.refused(timeout_s=4) == grpc.StatusCode.UNAUTHENTICATED
            assert await s.scheduler.queues.pending() == 2
            assert not sessions_of(s, "w1")
            # and a new stream with the revoked token is refused, while other workers' streams stay open
            for _ in range(3):  # (INTERNAL: grpc/grpc#36066, see above)
                async with RawPull.hello(s.as_("w1"), "w1", credits=2) as again:
                    seen = await again.refused()
                assert again.received == []
                if seen != grpc.StatusCode.INTERNAL:
                    break
            assert seen == grpc.StatusCode.UNAUTHENTICATED and len(stream.received) == 2
            assert bystander.error is None and sessions_of(s, "w2")
        assert await statuses(s, ids) == Counter({"PENDING": 2})
