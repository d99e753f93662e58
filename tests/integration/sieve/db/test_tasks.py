"""The tasks table's write statements against the real PostgreSQL: what each one commits, and that it
leaves nothing behind on the pooled connection."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from sieve.db import create_pool
from sieve.db.tasks import NewTask, Outcome, TaskStore
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
