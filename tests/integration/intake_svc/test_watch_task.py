"""WatchTask against real intake servers (alice and bob are clients, ops an operator), a real scheduler and worker,
and the real PostgreSQL: every status change of 500 tasks arrives in order across a forced disconnect and resume;
a change that commits late (an older id, a transaction still open) is neither skipped nor repeated; reads cut by
their limit go on where they stopped; a client sees only its own tasks; bad requests are refused naming the field;
streams are bounded per caller; a cursor older than the kept history is OUT_OF_RANGE."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from intake_svc.watch import decode_cursor, encode_cursor
from sieve.db.retention import Retention
from sieve.db.task_changes import ChangeFilter, Position, TaskChangeStore
from sieve.db.tasks import Outcome, TaskStore, Unmarked
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.security.test_tenants import as_, intake
from tests.support.platform import FINAL, platform_with
from tests.support.tasks import text_spec

SUCCEEDED = types_pb2.TASK_STATUS_SUCCEEDED


def status_changes(task: types_pb2.Task) -> list[tuple[int, int]]:
    """(sequence, status) of each status change in a task's history (a note keeping the status is not one)."""
    out: list[tuple[int, int]] = []
    previous = None
    for n, change in enumerate(task.history, start=1):
        if change.status != previous:
            out.append((n, change.status))
        previous = change.status
    return out


async def collect(
    stream: grpc.aio.UnaryStreamCall[intake_pb2.WatchTaskRequest, intake_pb2.WatchTaskResponse],
    seen: dict[str, list[tuple[int, int]]],
    until: int,
) -> str:
    """Reads changes into `seen` until `until` changes were read in all; returns the last one's cursor."""
    cursor = ""
    async for response in stream:
        for change in response.changes:
            seen[change.task_id].append((change.sequence, change.status))
            cursor = change.cursor
        if sum(len(v) for v in seen.values()) >= until:
            break
    return cursor


async def test_a_watcher_sees_every_status_change_of_500_tasks_in_order_across_a_disconnect_and_resume(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, workers=1, max_per_device_pending=1000) as p:
        stream = p.intake.WatchTask(intake_pb2.WatchTaskRequest())
        await asyncio.sleep(0.3)  # the stream stands at "now" before the first Submit
        specs = [text_spec(f"AA:BB:CC:20:00:{n % 10:02X}", f"watched {n}") for n in range(500)]
        ids: list[str] = []
        for start in range(0, 500, 100):
            reply = await p.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[start : start + 100]))
            ids += [item.task.task_id for item in reply.items]
        seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
        cursor = await asyncio.wait_for(collect(stream, seen, until=700), 30)
        stream.cancel()  # the client goes away while the tasks are still running
        await asyncio.sleep(0.5)  # changes go on meanwhile
        resumed = p.intake.WatchTask(intake_pb2.WatchTaskRequest(cursor=cursor))

        async def all_succeeded() -> None:
            async for response in resumed:
                for change in response.changes:
                    seen[change.task_id].append((change.sequence, change.status))
                if all(seen[t] and seen[t][-1][1] == SUCCEEDED for t in ids):
                    return

        await asyncio.wait_for(all_succeeded(), 60)
        resumed.cancel()
        for task_id in ids:
            task = (await p.intake.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
            assert task.status in FINAL
            # every change, once, in the order the history has them
            assert seen[task_id] == status_changes(task), task_id
        assert set(seen) == set(ids)


async def test_a_change_that_commits_late_is_neither_skipped_nor_repeated(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        a = (await t.submit("alice", text_spec("AA:BB:CC:21:00:01", "a"))).task.task_id
        b = (await t.submit("alice", text_spec("AA:BB:CC:21:00:02", "b"))).task.task_id
        store = TaskChangeStore(pg)
        scope = ChangeFilter(caller="alice")
        position = (await store.read(scope, await store.now(), 100)).position
        late = await pg.acquire()
        try:
            transaction = late.transaction()
            await transaction.start()
            # a's change takes its id first, and commits last
            await TaskStore(pg).transition([uuid.UUID(a)], "CANCELLED", "late", conn=late)
            await TaskStore(pg).transition([uuid.UUID(b)], "CANCELLED", "early")
            first = await store.read(scope, position, 100)
            assert [(str(c.task_id), c.status) for c in first.changes] == [(b, "CANCELLED")]
            await transaction.commit()
        finally:
            await pg.release(late)
        second = await store.read(scope, first.position, 100)
        assert [(str(c.task_id), c.status) for c in second.changes] == [(a, "CANCELLED")]
        assert second.changes[0].id < first.changes[0].id  # the older id, delivered after the newer one
        assert (await store.read(scope, second.position, 100)).changes == []

        # over gRPC: a stream resumed from b's change (its cursor taken before a committed) gets a's, once
        cursor_after_b = encode_cursor(Position(position.seen, first.reading, first.changes[0].id))
        stream = t.stub.WatchTask(intake_pb2.WatchTaskRequest(cursor=cursor_after_b), metadata=as_("alice"))
        got = []
        async for response in stream:
            got += [(c.task_id, c.status) for c in response.changes]
            break
        stream.cancel()
        assert got == [(a, types_pb2.TASK_STATUS_CANCELLED)]


async def test_reads_cut_by_their_limit_go_on_where_they_stopped(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        store = TaskChangeStore(pg)
        scope = ChangeFilter(caller="alice")
        position = await store.now()
        ids = [(await t.submit("alice", text_spec("AA:BB:CC:22:00:01", f"n{n}"))).task.task_id for n in range(7)]
        await TaskStore(pg).transition([uuid.UUID(i) for i in ids], "CANCELLED", "done")
        got: list[tuple[str, str]] = []
        cuts = 0
        while True:
            page = await store.read(scope, position, 3)
            got += [(str(c.task_id), c.status) for c in page.changes]
            position = page.position
            cuts += page.cut
            if not page.cut and not page.changes:
                break
        assert cuts >= 2  # 7 submits (a row each) and one transition of all 7 (one row), 3 rows a read
        assert got == [(i, "PENDING") for i in ids] + [(i, "CANCELLED") for i in ids]


@contextlib.asynccontextmanager
async def watching(
    stub: object, who: str, request: intake_pb2.WatchTaskRequest
) -> AsyncIterator[grpc.aio.UnaryStreamCall[intake_pb2.WatchTaskRequest, intake_pb2.WatchTaskResponse]]:
    stream = stub.WatchTask(request, metadata=as_(who))  # type: ignore[attr-defined]
    try:
        yield stream
    finally:
        stream.cancel()


async def test_a_client_watches_only_its_own_tasks_and_an_operator_every_callers(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with (
        intake(settings, redis, pg) as t,
        watching(t.stub, "bob", intake_pb2.WatchTaskRequest()) as bobs,
        watching(t.stub, "ops", intake_pb2.WatchTaskRequest()) as operators,
        watching(t.stub, "ops", intake_pb2.WatchTaskRequest(caller="bob")) as ops_on_bob,
    ):
        await asyncio.sleep(0.3)
        await t.submit("alice", text_spec("AA:BB:CC:23:00:01", "alice's"))
        b = (await t.submit("bob", text_spec("BB:BB:CC:23:00:01", "bob's"))).task.task_id
        bob_sees = (await asyncio.wait_for(bobs.read(), 5)).changes
        assert [(c.task_id, c.caller) for c in bob_sees] == [(b, "bob")]
        ops_sees: list[intake_pb2.TaskChange] = []
        while len(ops_sees) < 2:
            ops_sees += (await asyncio.wait_for(operators.read(), 5)).changes
        assert {c.caller for c in ops_sees} == {"alice", "bob"}
        assert [c.task_id for c in (await asyncio.wait_for(ops_on_bob.read(), 5)).changes] == [b]


async def test_a_watcher_of_given_tasks_gets_their_state_first_then_only_their_changes(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        mine = (await t.submit("alice", text_spec("AA:BB:CC:24:00:01", "watched", labels={"k": "v"}))).task.task_id
        other = (await t.submit("alice", text_spec("AA:BB:CC:24:00:02", "not watched"))).task.task_id
        request = intake_pb2.WatchTaskRequest(task_ids=[mine], initial_state=True)
        async with watching(t.stub, "alice", request) as stream:
            first = (await asyncio.wait_for(stream.read(), 5)).changes
            assert [(c.task_id, c.status, c.sequence) for c in first] == [(mine, types_pb2.TASK_STATUS_PENDING, 1)]
            await TaskStore(pg).transition([uuid.UUID(other)], "CANCELLED", "x")
            await TaskStore(pg).transition([uuid.UUID(mine)], "CANCELLED", "y")
            then = (await asyncio.wait_for(stream.read(), 5)).changes
            assert [(c.task_id, c.status, c.detail) for c in then] == [(mine, types_pb2.TASK_STATUS_CANCELLED, "y")]
        # a label filter: only the labelled task's changes
        async with watching(t.stub, "alice", intake_pb2.WatchTaskRequest(labels={"k": "v"})) as labelled:
            await asyncio.sleep(0.3)
            await t.submit("alice", text_spec("AA:BB:CC:24:00:03", "no label"))
            tagged = (await t.submit("alice", text_spec("AA:BB:CC:24:00:04", "label", labels={"k": "v"}))).task
            assert [c.task_id for c in (await asyncio.wait_for(labelled.read(), 5)).changes] == [tagged.task_id]


async def refusal(stub: object, who: str, request: intake_pb2.WatchTaskRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with watching(stub, who, request) as stream:
            await asyncio.wait_for(stream.read(), 5)
    return err.value


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"cursor": "dzM7NToxOjs1OjE6OzA7"}, "cursor"),  # a made-up position (xmin > xmax)
        ({"task_ids": ["nope"]}, "task_ids[0]"),
        ({"task_ids": [str(uuid.uuid4())] * 1001}, "task_ids"),
        ({"initial_state": True}, "initial_state"),
        ({"device_id": "not a mac"}, "device_id"),
        ({"labels": {"bad key!": "v"}}, "labels"),
    ],
)
async def test_a_bad_watch_request_is_refused_naming_the_field(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, request_fields: dict[str, object], field: str
) -> None:
    async with intake(settings, redis, pg) as t:
        err = await refusal(t.stub, "alice", intake_pb2.WatchTaskRequest(**request_fields))  # type: ignore[arg-type]
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith(field), err.details()


async def test_a_client_may_not_watch_another_callers_tasks(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with intake(settings, redis, pg) as t:
        err = await refusal(t.stub, "alice", intake_pb2.WatchTaskRequest(caller="bob"))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        bobs = (await t.submit("bob", text_spec("BB:BB:CC:25:00:01", "bob's"))).task.task_id
        err = await refusal(t.stub, "alice", intake_pb2.WatchTaskRequest(task_ids=[bobs], initial_state=True))
        assert err.code() == grpc.StatusCode.NOT_FOUND  # another caller's task is no task of hers


async def test_streams_are_bounded_per_caller(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with intake(settings, redis, pg, watch_max_streams_per_caller=2) as t:
        async with (
            watching(t.stub, "alice", intake_pb2.WatchTaskRequest()) as one,
            watching(t.stub, "alice", intake_pb2.WatchTaskRequest()) as two,
        ):
            await asyncio.sleep(0.3)
            err = await refusal(t.stub, "alice", intake_pb2.WatchTaskRequest())
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # another caller is not held back by alice's streams
            async with watching(t.stub, "bob", intake_pb2.WatchTaskRequest()) as bobs:
                b = (await t.submit("bob", text_spec("BB:BB:CC:26:00:01", "x"))).task.task_id
                assert [c.task_id for c in (await asyncio.wait_for(bobs.read(), 5)).changes] == [b]
            del one, two
        # closed streams free their slots
        await asyncio.sleep(0.3)
        async with watching(t.stub, "alice", intake_pb2.WatchTaskRequest()) as again:
            a = (await t.submit("alice", text_spec("AA:BB:CC:26:00:01", "y"))).task.task_id
            assert [c.task_id for c in (await asyncio.wait_for(again.read(), 5)).changes] == [a]


async def test_a_cursor_older_than_the_kept_history_is_out_of_range(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        async with watching(t.stub, "alice", intake_pb2.WatchTaskRequest()) as stream:
            await asyncio.sleep(0.3)
            await t.submit("alice", text_spec("AA:BB:CC:27:00:01", "x"))
            cursor = (await asyncio.wait_for(stream.read(), 5)).changes[0].cursor
        seen_xmin = int(decode_cursor(cursor).seen.split(":")[0])
        await pg.execute("UPDATE task_changes_purged SET up_to = $1::text::xid8", str(seen_xmin + 5))
        err = await refusal(t.stub, "alice", intake_pb2.WatchTaskRequest(cursor=cursor))
        assert err.code() == grpc.StatusCode.OUT_OF_RANGE


async def test_retention_deletes_old_changes_and_marks_what_it_deleted(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        await t.submit("alice", text_spec("AA:BB:CC:28:00:01", "x"))
        report = await Retention(pg, settings, batch=1).run(datetime.now(UTC) + timedelta(days=2))
        assert report.purged_changes == 1
        assert await pg.fetchval("SELECT count(*) FROM task_changes") == 0
        assert int(await pg.fetchval("SELECT up_to FROM task_changes_purged")) > 0


async def test_a_cursor_taken_inside_a_statements_changes_resumes_with_the_rest_of_them(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as t:
        task_id = (await t.submit("alice", text_spec("AA:BB:CC:29:00:01", "x"))).task.task_id
        async with watching(t.stub, "alice", intake_pb2.WatchTaskRequest(task_ids=[task_id])) as stream:
            await asyncio.sleep(0.3)
            # one statement records three changes: ASSIGNED and RUNNING at their times, then SUCCEEDED (a fast task's
            # result written without a RUNNING mark)
            now = datetime.now(UTC)
            outcome = Outcome(uuid.UUID(task_id), 1, "w1", "PASS", "[]", "x", unmarked=Unmarked(1, now, now))
            assert await TaskStore(pg).finish([outcome]) == {uuid.UUID(task_id)}
            changes = (await asyncio.wait_for(stream.read(), 5)).changes
        statuses = [types_pb2.TASK_STATUS_ASSIGNED, types_pb2.TASK_STATUS_RUNNING, types_pb2.TASK_STATUS_SUCCEEDED]
        assert [(c.status, c.sequence) for c in changes] == list(zip(statuses, (2, 3, 4), strict=True))
        assert changes[2].verdict == types_pb2.VERDICT_PASS
        # resumed after the first of them: the other two, once; after the last: nothing
        resumed = t.stub.WatchTask(intake_pb2.WatchTaskRequest(cursor=changes[0].cursor), metadata=as_("alice"))
        rest = (await asyncio.wait_for(resumed.read(), 5)).changes
        resumed.cancel()
        assert [c.status for c in rest] == statuses[1:]
        async with watching(t.stub, "alice", intake_pb2.WatchTaskRequest(cursor=changes[2].cursor)) as after_last:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(after_last.read(), 1.5)
