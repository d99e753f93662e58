"""A task's lifecycle as PostgreSQL records it, after each way a hand-out ends: ASSIGNED while its worker has not
started it, RUNNING, and PENDING again — without a worker id, with the reason (and when it may run again) in its
history — after a nack, a worker gone, a lease that expired, an execution timeout; dead-lettered at the task's
own max_attempts; GetTask's attempt_log telling each attempt apart.

Real intake and scheduler servers in this process on real Redis and PostgreSQL; the workers are real Pull streams
that answer what the test says (`RawPull`), or real workers."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from sieve.db.tasks import Outcome, TaskStore
from sieve.redis.leases import lease_number
from sieve.settings import Settings
from sieve.v1 import intake_pb2, scheduler_pb2, types_pb2
from tests.integration.conftest import Platform, platform_with, text_spec, wait_final
from tests.security.auth_stack import RawPull, eventually

DEVICE = "AA-BB-CC-DD-EE-42"
S = types_pb2


async def submit(p: Platform, **kw: object) -> str:
    spec = text_spec(DEVICE, "加微信 hello", **kw)
    return (await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id


async def row(p: Platform, task_id: str) -> asyncpg.Record:
    return await p.pg.fetchrow(
        "SELECT status, worker_id, lease, attempts, history FROM tasks WHERE id = $1", uuid.UUID(task_id)
    )


async def status_is(p: Platform, task_id: str, *statuses: str) -> bool:
    return (await row(p, task_id))["status"] in statuses


async def get(p: Platform, task_id: str) -> types_pb2.Task:
    return (await p.intake.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task


def put_backs(history: list[dict[str, object]]) -> list[dict[str, object]]:
    return [h for h in history if h["status"] == "PENDING" and "counted" in h]


async def put_back(p: Platform, task_id: str, count: int = 1) -> bool:
    """The task is PENDING again after `count` put-backs (the initial PENDING does not count)."""
    r = await row(p, task_id)
    return r["status"] == "PENDING" and len(put_backs(r["history"])) >= count


async def test_a_task_is_assigned_until_its_worker_starts_it_then_pending_without_worker_when_its_worker_goes(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg) as p:
        task_id = await submit(p)
        # Given a worker that takes the task and does not start it
        async with RawPull.hello(p.settings, "lazy", credits=1) as lazy:
            [a] = await lazy.wait_for(1)
            # Then the task is ASSIGNED to it, at the time of the hand-out, before anything ran
            await eventually(lambda: status_is(p, task_id, "ASSIGNED"), 5, "never ASSIGNED")
            r = await row(p, task_id)
            assert r["worker_id"] == "lazy" and r["lease"] == lease_number(a.lease_token)
            assigned = [h for h in r["history"] if h["status"] == "ASSIGNED"]
            assert len(assigned) == 1 and assigned[0]["worker"] == "lazy"
            assert abs(datetime.fromisoformat(assigned[0]["at"]) - a.assigned_at.ToDatetime(UTC)).total_seconds() < 1
            task = await get(p, task_id)
            assert task.status == S.TASK_STATUS_ASSIGNED
            [attempt] = task.attempt_log
            assert (attempt.worker_id, attempt.lease, attempt.attempt) == ("lazy", lease_number(a.lease_token), 1)
            assert attempt.HasField("assigned_at") and not attempt.HasField("started_at")
            assert attempt.outcome == S.TASK_STATUS_UNSPECIFIED
        # When its stream closes, Then it is PENDING again, with no worker, and the history says why
        await eventually(lambda: put_back(p, task_id), 5, "not put back")
        r = await row(p, task_id)
        assert r["worker_id"] is None
        [back] = put_backs(r["history"])
        assert back["detail"] == "worker gone: its stream closed" and back["counted"] is True
        assert back["worker"] == "lazy" and back["lease"] == lease_number(a.lease_token)
        [attempt] = (await get(p, task_id)).attempt_log
        assert attempt.outcome == S.TASK_STATUS_PENDING and attempt.counted
        assert attempt.detail == "worker gone: its stream closed"


async def test_a_nacked_task_is_pending_with_its_reason_and_due_time_then_a_later_attempt_succeeds(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, retry_backoff_base_s=2.0) as p:
        task_id = await submit(p)
        async with RawPull.hello(p.settings, "flaky", credits=1) as flaky:
            [a] = await flaky.wait_for(1)
            # When the worker hands it back for a reason that may pass
            flaky.send(
                scheduler_pb2.PullRequest(
                    nacks=[
                        scheduler_pb2.Nack(
                            task_id=task_id,
                            lease_token=a.lease_token,
                            reason="fetch failed: timed out",
                            count_attempt=True,
                        )
                    ]
                )
            )
            await eventually(lambda: put_back(p, task_id), 5, "not put back")
            # Then it is PENDING, without a worker, with the reason and the time of its retry (the backoff)
            r = await row(p, task_id)
            assert r["worker_id"] is None
            [back] = put_backs(r["history"])
            assert back["detail"] == "nacked: fetch failed: timed out" and back["counted"] is True
            due = datetime.fromisoformat(back["retry_at"]) - datetime.fromisoformat(back["at"])
            assert 1.0 < due.total_seconds() < 3.0, back
            # and it waits out that delay before it is handed out again
            assert len(flaky.received) == 1
        # When a real worker is there once the delay is over, Then the second attempt succeeds
        await p.add_worker(worker_id="steady")
        task = await wait_final(p.intake, task_id, 15)
        assert task.status == S.TASK_STATUS_SUCCEEDED and task.attempts == 2
        first, second = task.attempt_log
        assert (first.worker_id, first.attempt, first.outcome, first.detail) == (
            "flaky",
            1,
            S.TASK_STATUS_PENDING,
            "nacked: fetch failed: timed out",
        )
        assert first.counted and first.HasField("retry_at")
        assert (second.worker_id, second.attempt, second.outcome) == ("steady", 2, S.TASK_STATUS_SUCCEEDED)
        assert second.lease > first.lease
        assert second.assigned_at.ToDatetime() <= second.started_at.ToDatetime() <= second.ended_at.ToDatetime()
        statuses = [S.TaskStatus.Name(h.status).removeprefix("TASK_STATUS_") for h in task.history]
        assert statuses == ["PENDING", "ASSIGNED", "PENDING", "ASSIGNED", "RUNNING", "SUCCEEDED"]


async def test_an_expired_lease_puts_the_task_back_and_its_late_ack_start_and_result_are_refused(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, lease_ttl_s=1.0) as p:
        task_id = await submit(p)
        async with RawPull.hello(p.settings, "frozen", credits=1) as frozen:
            [a] = await frozen.wait_for(1)
            # When the worker says nothing for longer than the lease (its stream stays open)
            await eventually(lambda: put_back(p, task_id), 10, "lease not reclaimed")
            r = await row(p, task_id)
            [back] = put_backs(r["history"])
            assert back["detail"] == "lease expired" and back["counted"] is True and r["worker_id"] is None
            # Then its late start and result are refused by fencing, and so is its ack
            store = TaskStore(p.pg)
            lease = lease_number(a.lease_token)
            assert await store.start("frozen", [(uuid.UUID(task_id), lease, 1, datetime.now(UTC))]) == []
            assert await store.finish([Outcome(uuid.UUID(task_id), lease, "frozen", "PASS", "[]", "x")]) == set()
            refused = p.scheduler.streams.fencing_refusals
            frozen.send(scheduler_pb2.PullRequest(acks=[scheduler_pb2.Ack(task_id=task_id, lease_token=a.lease_token)]))
            await eventually(lambda: _true(p.scheduler.streams.fencing_refusals > refused), 5, "ack not refused")
            assert await status_is(p, task_id, "PENDING")


async def test_a_hand_out_past_its_execution_timeout_is_taken_back_while_its_stream_lives_and_dead_lettered(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(
        settings, redis, pg, text_timeout_s=0.5, execution_timeout_grace_s=0.2, retry_backoff_base_s=0.1
    ) as p:
        # Given a task that may be tried twice, and a worker that keeps talking but never finishes anything
        task_id = await submit(p, max_attempts=2)
        async with RawPull.hello(p.settings, "stuck", credits=5) as stuck:

            async def keep_talking() -> None:
                while True:
                    stuck.send(scheduler_pb2.PullRequest())
                    await asyncio.sleep(0.1)

            talker = asyncio.create_task(keep_talking())
            try:
                # Then each hand-out is taken back past 0.5 s + grace, counted, and at the second it is dead-lettered
                await eventually(lambda: status_is(p, task_id, "DEAD_LETTERED"), 15, "not dead-lettered")
                assert [a.attempt for a in stuck.received] == [1, 2]
                [session] = [s for s in p.scheduler.board.sessions if s.worker_id == "stuck"]
                assert not session.closed and task_id not in session.held
                # and the worker's late ack of its first hand-out is refused
                refused = p.scheduler.streams.fencing_refusals
                stuck.send(
                    scheduler_pb2.PullRequest(
                        acks=[scheduler_pb2.Ack(task_id=task_id, lease_token=stuck.received[0].lease_token)]
                    )
                )
                await eventually(lambda: _true(p.scheduler.streams.fencing_refusals > refused), 5, "ack accepted")
            finally:
                talker.cancel()
        assert p.scheduler.housekeeping.execution_timeouts == {"TEXT": 2}
        task = await get(p, task_id)
        assert task.status == S.TASK_STATUS_DEAD_LETTERED and task.max_attempts == 2
        first, second = task.attempt_log
        assert first.outcome == S.TASK_STATUS_PENDING and first.counted
        assert first.detail == "execution timed out: ran longer than 0.5s"
        assert second.outcome == S.TASK_STATUS_DEAD_LETTERED
        assert second.detail == "execution timed out: ran longer than 0.5s"
        [letter] = (await p.scheduler_stub.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest())).dead_letters
        assert letter.task_id == task_id and letter.attempts == 2


async def test_max_attempts_is_the_tasks_own_bounded_by_the_setting(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, max_attempts=4, retry_backoff_base_s=0.05) as p:
        # An attempt limit above the global one is refused, naming the field, and changes nothing
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await submit(p, max_attempts=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "task.max_attempts" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await p.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=[text_spec(DEVICE, "x", max_attempts=9)]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tasks[0].max_attempts" in (err.value.details() or "")
        assert await p.pg.fetchval("SELECT count(*) FROM tasks") == 0
        # A task that may be tried once is dead-lettered at its first counted failure; one with the default is not
        once = await submit(p, max_attempts=1)
        default = await submit(p)
        assert (await get(p, once)).max_attempts == 1 and (await get(p, default)).max_attempts == 0
        async with RawPull.hello(p.settings, "failing", credits=2) as failing:
            assignments = await failing.wait_for(2)
            failing.send(
                scheduler_pb2.PullRequest(
                    credits=2,
                    nacks=[
                        scheduler_pb2.Nack(
                            task_id=a.task_id, lease_token=a.lease_token, reason="broken", count_attempt=True
                        )
                        for a in assignments
                    ],
                )
            )
            await eventually(lambda: status_is(p, once, "DEAD_LETTERED"), 5, "not dead-lettered at its limit")
            await eventually(lambda: put_back(p, default), 5, "not put back")
            await failing.wait_for(3)  # the default one comes back for its second attempt
        assert [a.task_id for a in failing.received].count(once) == 1


async def test_a_put_back_that_does_not_count_keeps_the_attempt_number(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg) as p:
        task_id = await submit(p)
        async with RawPull.hello(p.settings, "busy", credits=1) as busy:
            [a] = await busy.wait_for(1)
            nack = scheduler_pb2.Nack(task_id=task_id, lease_token=a.lease_token, reason="worker over watermark")
            nack.retry_after.FromMilliseconds(100)
            busy.send(scheduler_pb2.PullRequest(nacks=[nack], credits=1))
            [_, again] = await busy.wait_for(2)
        assert again.attempt == 1 and lease_number(again.lease_token) > lease_number(a.lease_token)
        await eventually(lambda: put_back(p, task_id, 2), 5, "not put back")
        back = put_backs((await row(p, task_id))["history"])[0]  # (the second goes back when the stream closes)
        assert back["counted"] is False and back["detail"] == "nacked: worker over watermark"


async def _true(value: bool) -> bool:
    return value


async def test_the_schedulers_status_writes_skip_rows_a_worker_is_writing_instead_of_waiting(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    from sieve.db.tasks import HandOut, PutBack

    async with platform_with(settings, redis, pg) as p:
        ids = [uuid.UUID(await submit(p)) for _ in range(2)]
        store = TaskStore(p.pg)
        now = datetime.now(UTC)
        async with p.pg.acquire() as conn, conn.transaction():
            # Given a worker's transaction holding the first row (it is writing it)
            await conn.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE", ids[0])
            # Then the scheduler's writes go around it at once: ASSIGNED only for the other row, and the
            # put-back says which row it could not write yet
            moved = await asyncio.wait_for(store.assigned([HandOut(i, 5, 1, "w", now) for i in ids]), 2)
            assert moved == 1
            done, skipped = await asyncio.wait_for(
                store.put_back([PutBack(i, 5, "w", "lease expired", True) for i in ids]), 2
            )
            assert done == [ids[1]] and skipped == [ids[0]]
        # When the row is free again, the put-back of it goes through
        assert await store.put_back([PutBack(ids[0], 5, "w", "lease expired", True)]) == ([ids[0]], [])
        assert (await row(p, str(ids[0])))["lease"] == 5
