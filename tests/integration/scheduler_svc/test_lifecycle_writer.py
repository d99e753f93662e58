"""The scheduler's status writer against the real PostgreSQL: an ASSIGNED record waits its delay, is not written
when its hand-out's ack was proven meanwhile, is written before the put-back when the hand-out is taken back, and
is written once the delay is over when the hand-out is still out; `flush` writes what still waits, and
`write_waiting` one hand-out's record before a final status would refuse it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from scheduler_svc.lifecycle import LifecycleWriter
from sieve.db.tasks import HandOut, NewTask, PutBack, TaskStore
from sieve.v1 import types_pb2


def _task() -> NewTask:
    now = datetime.now(UTC)
    return NewTask(
        uuid.uuid4(),
        "AA:BB:CC:DD:EE:07",
        types_pb2.TASK_TYPE_TEXT,
        types_pb2.PRIORITY_NORMAL,
        "tests",
        now,
        now + timedelta(hours=1),
        text="hello",
    )


async def _statuses(pg: asyncpg.Pool, task_id: uuid.UUID) -> tuple[str, list[str]]:
    row = await pg.fetchrow("SELECT status, history FROM tasks WHERE id = $1", task_id)
    assert row is not None
    return row["status"], [h["status"] for h in row["history"]]


async def test_assigned_records_wait_and_are_dropped_for_proven_acks_written_for_put_backs_and_late_ones(
    pg: asyncpg.Pool,
) -> None:
    store = TaskStore(pg)
    acked, taken_back, slow, flushed, dead = tasks = [_task() for _ in range(5)]
    await store.insert(tasks)
    writer = LifecycleWriter(store, delay_s=2.0)
    now = datetime.now(UTC)
    try:
        writer.assigned([HandOut(t.task_id, 1, 1, "w1", now) for t in tasks[:3]])
        await asyncio.sleep(0.1)
        # Then nothing is written yet
        for t in tasks:
            assert await _statuses(pg, t.task_id) == ("PENDING", ["PENDING"])

        # When one hand-out's ack is proven and another is taken back, within the delay
        writer.settled([(acked.task_id, 1)])
        writer.put_back([PutBack(taken_back.task_id, 1, "w1", "nacked: busy", False)])
        # Then the one taken back has its ASSIGNED record before the put-back's, at once; the others still wait
        for _ in range(100):
            if len((await _statuses(pg, taken_back.task_id))[1]) > 2:
                break
            await asyncio.sleep(0.01)
        assert await _statuses(pg, taken_back.task_id) == ("PENDING", ["PENDING", "ASSIGNED", "PENDING"])
        assert await _statuses(pg, slow.task_id) == ("PENDING", ["PENDING"])

        # When the delay is over, Then the hand-out still out is ASSIGNED; the settled one was never written
        await asyncio.sleep(2.2)
        assert await _statuses(pg, slow.task_id) == ("ASSIGNED", ["PENDING", "ASSIGNED"])
        assert await _statuses(pg, acked.task_id) == ("PENDING", ["PENDING"])
        assert writer.skipped == 1

        # And flush writes a record that still waits, without waiting for its delay
        writer.assigned([HandOut(flushed.task_id, 1, 1, "w2", now)])
        await writer.flush()
        assert await _statuses(pg, flushed.task_id) == ("ASSIGNED", ["PENDING", "ASSIGNED"])

        # And a hand-out about to be dead-lettered has its waiting record written now, before the final status
        writer.assigned([HandOut(dead.task_id, 1, 1, "w2", now)])
        await writer.write_waiting([(dead.task_id, 1)])
        assert await _statuses(pg, dead.task_id) == ("ASSIGNED", ["PENDING", "ASSIGNED"])
        assert writer.written == 4 + 1  # four ASSIGNED records and one put-back
    finally:
        await writer.close()
