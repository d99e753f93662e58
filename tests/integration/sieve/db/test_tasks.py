"""The tasks table's write statements against the real PostgreSQL: what each one commits, and that it
leaves nothing behind on the pooled connection."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from sieve.db import Warm, create_pool
from sieve.db.tasks import HandOut, NewTask, Outcome, PutBack, TaskStore
from sieve.settings import Settings
from sieve.v1 import types_pb2


def _task() -> NewTask:
    now = datetime.now(UTC)
    return NewTask(
        uuid.uuid4(),
        "AA:BB:CC:DD:EE:01",
        types_pb2.TASK_TYPE_TEXT,
        types_pb2.PRIORITY_NORMAL,
        "tests",
        now,
        now + timedelta(hours=1),
        text="hello",
    )


async def test_starting_tasks_relaxes_only_its_own_commit_and_the_connection_stays_durable(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    # Given a pool of exactly one connection, and a recorded task
    pool = await create_pool(settings.replace(db_pool_min=1, db_pool_max=1), attempts=1, migrate_first=False)
    try:
        store = TaskStore(pool)
        task = _task()
        await store.insert([task])

        # When a worker starts it
        [started] = await store.start("w1", [(task.task_id, 1, 1, datetime.now(UTC))])

        # Then it runs, and the next statement on the same connection commits durably again
        assert started.text == "hello"
        assert await pool.fetchval("SHOW synchronous_commit") == "on"
        assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", task.task_id) == "RUNNING"
    finally:
        await pool.close()


async def test_a_result_write_that_fails_changes_no_status(pg: asyncpg.Pool) -> None:
    # Given a running task
    store = TaskStore(pg)
    task = _task()
    await store.insert([task])
    await store.start("w1", [(task.task_id, 1, 1, datetime.now(UTC))])

    # When its result cannot be stored (a verdict the results table refuses)
    with pytest.raises(asyncpg.CheckViolationError):
        await store.finish([Outcome(task.task_id, 1, "w1", "MAYBE", "[]", "hello")])

    # Then the status update of the same statement did not happen either: the task is still RUNNING
    assert await pg.fetchval("SELECT status FROM tasks WHERE id = $1", task.task_id) == "RUNNING"
    assert await pg.fetchval("SELECT count(*) FROM results WHERE task_id = $1", task.task_id) == 0

    # And a good result for the same lease is stored once; a stale lease is refused
    assert await store.finish([Outcome(task.task_id, 1, "w1", "PASS", "[]", "hello")]) == {task.task_id}
    assert await store.finish([Outcome(task.task_id, 0, "w0", "PASS", "[]", "hello")]) == set()
    assert await pg.fetchval("SELECT status FROM tasks WHERE id = $1", task.task_id) == "SUCCEEDED"


async def _row(pg: asyncpg.Pool, task_id: uuid.UUID) -> asyncpg.Record:
    row = await pg.fetchrow("SELECT status, lease, attempts, worker_id, history FROM tasks WHERE id = $1", task_id)
    assert row is not None
    return row


async def test_a_hand_out_run_without_a_mark_is_read_without_a_write_and_finished_with_its_history(
    pg: asyncpg.Pool,
) -> None:
    store = TaskStore(pg)
    fresh, assigned = _task(), _task()
    await store.insert([fresh, assigned])
    at = datetime.now(UTC) - timedelta(seconds=1)
    # Given one task the scheduler's ASSIGNED record reached first, and one it did not
    await store.assigned([HandOut(assigned.task_id, 3, 1, "w1", at)])
    before = {t.task_id: await _row(pg, t.task_id) for t in (fresh, assigned)}

    # When a worker reads them for a run without a RUNNING mark
    started = await store.read_unmarked([(fresh.task_id, 3, 1, at), (assigned.task_id, 3, 1, at)])

    # Then it gets their payloads, and nothing was written
    assert {s.task_id: s.text for s in started} == {fresh.task_id: "hello", assigned.task_id: "hello"}
    assert all(s.unmarked is not None and s.unmarked.attempt == 1 and s.attempt == 3 for s in started)
    for t in (fresh, assigned):
        assert await _row(pg, t.task_id) == before[t.task_id]

    # When their results are stored, Then each goes straight to SUCCEEDED, with ASSIGNED (unless recorded) and
    # RUNNING at their real times before it, for that lease and worker
    outcomes = [Outcome(s.task_id, s.attempt, "w1", "PASS", "[]", "hello", unmarked=s.unmarked) for s in started]
    assert await store.finish(outcomes) == {fresh.task_id, assigned.task_id}
    for t in (fresh, assigned):
        row = await _row(pg, t.task_id)
        assert (row["status"], row["lease"], row["attempts"], row["worker_id"]) == ("SUCCEEDED", 3, 1, "w1")
        entries = [(h["status"], h.get("lease"), h.get("worker")) for h in row["history"]]
        assert entries == [
            ("PENDING", None, None),
            ("ASSIGNED", 3, "w1"),
            ("RUNNING", 3, "w1"),
            ("SUCCEEDED", 3, "w1"),
        ]
        assigned_at = datetime.fromisoformat(row["history"][1]["at"])
        assert abs((assigned_at - at).total_seconds()) < 0.01
        assert assigned_at <= datetime.fromisoformat(row["history"][2]["at"])
    assert await pg.fetchval("SELECT count(*) FROM results WHERE task_id = ANY($1::uuid[])", list(before)) == 2


async def test_a_hand_out_run_without_a_mark_is_fenced_as_a_marked_one(pg: asyncpg.Pool) -> None:
    store = TaskStore(pg)
    put_back, newer, cancelled, done = tasks = [_task() for _ in range(4)]
    await store.insert(tasks)
    at = datetime.now(UTC)
    # Given hand-outs of lease 2 of which one was put back, one overtaken by lease 3 (marked RUNNING), one
    # cancelled and one already finished by another hand-out of lease 2
    assert (await store.put_back([PutBack(put_back.task_id, 2, "w1", "lease expired", True)]))[0]
    await store.start("w2", [(newer.task_id, 3, 1, at)])
    await store.transition([cancelled.task_id], "CANCELLED", "cancelled by the caller")
    [first] = await store.read_unmarked([(done.task_id, 2, 1, at)])
    assert await store.finish([Outcome(done.task_id, 2, "w1", "PASS", "[]", "x", unmarked=first.unmarked)])

    # Then none of them is read for lease 2
    reads = [(t.task_id, 2, 1, at) for t in tasks]
    assert await store.read_unmarked(reads) == []
    # and a result of lease 2 stored anyway (read before the change) is refused, changing nothing
    unmarked = first.unmarked
    late = [Outcome(t.task_id, 2, "w1", "PASS", "[]", "late", unmarked=unmarked) for t in tasks]
    before = [await _row(pg, t.task_id) for t in tasks]
    assert await store.finish(late) == set()
    assert [await _row(pg, t.task_id) for t in tasks] == before
    assert await pg.fetchval("SELECT text FROM results WHERE task_id = $1", done.task_id) == "x"
    # while the marked hand-out of lease 3 still finishes as before
    assert await store.finish([Outcome(newer.task_id, 3, "w2", "PASS", "[]", "y")]) == {newer.task_id}


def _batch(devices: int, per_device: int, key_every: int = 0) -> list[NewTask]:
    """`per_device` tasks for each of `devices` devices, interleaved; with `key_every`, every task of a device
    whose index is a multiple of it carries that device's one idempotency key (so the second such task repeats
    the first)."""
    now = datetime.now(UTC)
    out = []
    for i in range(per_device):
        for d in range(devices):
            keyed = key_every and i % key_every == 0
            out.append(
                NewTask(
                    uuid.uuid4(),
                    f"AA:BB:CC:00:{d // 256:02X}:{d % 256:02X}",
                    types_pb2.TASK_TYPE_TEXT,
                    types_pb2.PRIORITY_NORMAL,
                    "tests",
                    now,
                    now + timedelta(hours=1),
                    text=f"task {i} of device {d}",
                    idempotency_key="k" if keyed else None,
                    fingerprint=b"same" if keyed else None,
                )
            )
    return out


async def test_a_large_batch_is_recorded_in_parts_and_answered_in_its_own_order(pg: asyncpg.Pool) -> None:
    # Given 1 200 tasks over 300 devices, where the 1st and 3rd task of each device share an idempotency key
    batch = _batch(300, 4, key_every=2)
    # When they are recorded at once (in parts, written side by side)
    recorded = await TaskStore(pg).insert(batch)
    # Then every answer is in the batch's order: each first keyed task and every unkeyed one is new, and each
    # device's repeated key names its own earlier task
    assert len(recorded) == len(batch)
    first_of: dict[str, uuid.UUID] = {}
    for task, rec in zip(batch, recorded, strict=True):
        if task.idempotency_key is None:
            assert rec.created and rec.task_id == task.task_id
        elif task.device not in first_of:
            assert rec.created and rec.task_id == task.task_id
            first_of[task.device] = task.task_id
        else:
            assert not rec.created and not rec.conflict and rec.task_id == first_of[task.device]
    ids = [t.task_id for t in batch]
    assert await pg.fetchval("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[])", ids) == 900


async def test_when_one_part_of_a_batch_fails_no_row_of_the_batch_is_left(pg: asyncpg.Pool) -> None:
    # Given 1 000 tasks over 250 devices, one of whose texts PostgreSQL refuses (a NUL character)
    batch = _batch(250, 4, key_every=4)
    bad = batch[-1]
    batch[-1] = NewTask(
        bad.task_id, bad.device, bad.task_type, bad.priority, bad.caller, bad.created_at, bad.expires_at, text="a\x00b"
    )
    # When they are recorded
    with pytest.raises(asyncpg.PostgresError):
        await TaskStore(pg).insert(batch)
    # Then the parts that were written are withdrawn: neither a task nor a key of the batch is left
    ids = [t.task_id for t in batch]
    assert await pg.fetchval("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[])", ids) == 0
    assert await pg.fetchval("SELECT count(*) FROM idempotency_keys WHERE task_id = ANY($1::uuid[])", ids) == 0


async def test_a_warmed_pool_opens_its_connections_at_once_each_with_the_record_prepared_and_nothing_written(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    # Given a pool warmed for the record, of three connections
    pool = await create_pool(
        settings.replace(db_pool_min=1, db_pool_max=4),
        attempts=1,
        migrate_first=False,
        warm=Warm(3, TaskStore.warm_connection),
    )
    try:
        # Then three connections are open before any is asked for
        assert pool.get_size() == 3
        # And each holds the record statement prepared, so that its first batch does not parse and plan it
        held = [await pool.acquire() for _ in range(3)]
        try:
            for conn in held:
                prepared = await conn.fetchval(
                    "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%INSERT INTO tasks%' "
                    "AND statement NOT LIKE '%pg_prepared_statements%'"
                )
                assert prepared == 1
        finally:
            for conn in held:
                await pool.release(conn)
        # And warming wrote nothing: no task, no change-feed row
        assert await pg.fetchval("SELECT count(*) FROM tasks") == 0
        assert await pg.fetchval("SELECT count(*) FROM task_changes") == 0
        # And a record on a warmed connection works as on any other
        task = _task()
        assert [r.created for r in await TaskStore(pool).insert([task])] == [True]
    finally:
        await pool.close()


async def test_warming_before_the_schema_is_migrated_leaves_the_statement_for_its_first_use(settings: Settings) -> None:
    # Given a schema that does not exist yet
    empty = settings.replace(database_schema=f"not_yet_{uuid.uuid4().hex[:8]}", db_pool_min=1, db_pool_max=2)
    # When a warmed pool opens on it
    pool = await create_pool(empty, attempts=1, migrate_first=False, warm=Warm(2, TaskStore.warm_connection))
    try:
        # Then it opens all the same, its connections usable
        assert pool.get_size() == 2
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()
