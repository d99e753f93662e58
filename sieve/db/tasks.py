"""The tasks table: every SQL statement that reads or changes a task or its result lives here.

Status changes append to the task's `history` (status, time, attempt, detail) in the same statement.
Writes come in batches (`unnest` arrays), so one round trip serves many tasks.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from sieve.v1 import types_pb2

FINAL_STATUSES = ("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED", "DEAD_LETTERED")
OPEN_STATUSES = ("PENDING", "ASSIGNED", "RUNNING")


def type_name(value: int) -> str:
    return types_pb2.TaskType.Name(value).removeprefix("TASK_TYPE_")


def type_value(name: str) -> int:
    return types_pb2.TaskType.Value("TASK_TYPE_" + name)


def status_value(name: str) -> int:
    return types_pb2.TaskStatus.Value("TASK_STATUS_" + name)


def ms_to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated task about to be recorded."""

    task_id: uuid.UUID
    device: str
    task_type: int
    priority: int
    caller: str
    created_at: datetime
    expires_at: datetime
    text: str | None = None
    image: bytes | None = None
    image_url: str | None = None
    idempotency_key: str | None = None
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """The row a NewTask ended up as: itself, or the earlier task with the same idempotency key."""

    task_id: uuid.UUID
    created: bool
    row: asyncpg.Record | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """A task a worker may run now (its hand-out is the current one), with its payload."""

    task_id: uuid.UUID
    task_type: str
    #: the lease (hand-out) number: the fencing token its Outcome must carry
    attempt: int
    text: str | None
    image: bytes | None
    image_url: str | None
    trace_context: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a worker stores for one attempt."""

    task_id: uuid.UUID
    #: the lease (hand-out) number of the attempt (Started.attempt): only the current one is stored
    attempt: int
    worker_id: str
    #: None when the task failed
    verdict: str | None
    hits_json: str
    text: str
    details_json: str = "{}"
    error: str | None = None


class TaskStore:
    """Reads and writes tasks and results through one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # --- intake ---------------------------------------------------------------------------------
    async def insert(self, tasks: Sequence[NewTask]) -> list[Recorded]:
        """Records new tasks (status PENDING) in one statement; a repeated idempotency key returns the
        earlier task instead of creating one."""
        rows = await self.pool.fetch(
            """
            INSERT INTO tasks (id, device, type, priority, status, caller, idempotency_key, payload_text,
                               payload_bytes, payload_url, created_at, updated_at, expires_at, enqueued_at,
                               trace_context, history)
            SELECT u.id, u.device, u.type, u.priority, 'PENDING', u.caller, u.key, u.text, u.image, u.url,
                   u.created, u.created, u.expires, u.created, u.trace,
                   jsonb_build_array(jsonb_build_object('status', 'PENDING', 'at', u.created,
                                                        'attempt', 0, 'detail', 'accepted from ' || u.caller))
            FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::text[], $6::text[],
                        $7::text[], $8::bytea[], $9::text[], $10::timestamptz[], $11::timestamptz[],
                        $12::text[])
                 AS u(id, device, type, priority, caller, key, text, image, url, created, expires, trace)
            ON CONFLICT (caller, device, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING id
            """,
            [t.task_id for t in tasks], [t.device for t in tasks], [type_name(t.task_type) for t in tasks],
            [t.priority for t in tasks], [t.caller for t in tasks], [t.idempotency_key for t in tasks],
            [t.text for t in tasks], [t.image for t in tasks], [t.image_url for t in tasks],
            [t.created_at for t in tasks], [t.expires_at for t in tasks], [t.trace_context for t in tasks],
        )
        created = {r["id"] for r in rows}
        out: list[Recorded] = []
        for t in tasks:
            if t.task_id in created:
                out.append(Recorded(t.task_id, True))
                continue
            existing = await self.pool.fetchrow(
                "SELECT * FROM tasks WHERE caller = $1 AND device = $2 AND idempotency_key = $3",
                t.caller, t.device, t.idempotency_key)
            if existing is None:  # the earlier task was withdrawn meanwhile: record this one
                again = await self.insert([t])
                out.append(again[0])
            else:
                out.append(Recorded(existing["id"], False, existing))
        return out

    async def withdraw(self, task_ids: Sequence[uuid.UUID]) -> None:
        """Removes tasks that were recorded but could not be queued (the caller was told no)."""
        await self.pool.execute(
            "DELETE FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'PENDING' AND attempts = 0",
            list(task_ids))

    # --- reading ----------------------------------------------------------------------------------
    async def get(self, task_id: uuid.UUID) -> tuple[asyncpg.Record, asyncpg.Record | None] | None:
        row = await self.pool.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
        if row is None:
            return None
        result = await self.pool.fetchrow("SELECT * FROM results WHERE task_id = $1", task_id)
        return row, result

    async def unfinished(self, task_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Which of these tasks are not final (one indexed lookup; acks are checked against it)."""
        rows = await self.pool.fetch("SELECT id FROM tasks WHERE id = ANY($1::uuid[]) AND status = ANY($2::text[])",
                                     list(task_ids), list(OPEN_STATUSES))
        return {r["id"] for r in rows}

    async def pending_by_class(self) -> list[tuple[int, str, int]]:
        """(priority, type, count) of PENDING tasks (metrics; the partial index on PENDING keeps it cheap)."""
        rows = await self.pool.fetch(
            "SELECT priority, type, count(*) AS n FROM tasks WHERE status = 'PENDING' GROUP BY priority, type")
        return [(r["priority"], r["type"], r["n"]) for r in rows]

    # --- status changes -----------------------------------------------------------------------------
    async def transition(self, task_ids: Sequence[uuid.UUID], status: str, detail: str,
                         *, error: str | None = None, only_from: Sequence[str] = OPEN_STATUSES,
                         conn: Any = None) -> list[uuid.UUID]:
        """Moves open tasks to `status`, appending to their history; returns those that moved."""
        rows = await (conn or self.pool).fetch(
            """
            UPDATE tasks SET status = $2, updated_at = now(), error = COALESCE($4, error),
                   history = history || jsonb_build_array(jsonb_build_object(
                       'status', $2::text, 'at', now(), 'attempt', attempts, 'detail', $3::text))
            WHERE id = ANY($1::uuid[]) AND status = ANY($5::text[])
            RETURNING id
            """,
            list(task_ids), status, detail, error, list(only_from))
        return [r["id"] for r in rows]

    async def note(self, task_ids: Sequence[uuid.UUID], detail: str) -> None:
        """Appends a remark (e.g. a routing decision) to open tasks' history without changing status."""
        await self.pool.execute(
            """
            UPDATE tasks SET history = history || jsonb_build_array(jsonb_build_object(
                       'status', status, 'at', now(), 'attempt', attempts, 'detail', $2::text))
            WHERE id = ANY($1::uuid[]) AND status = ANY($3::text[])
            """, list(task_ids), detail, list(OPEN_STATUSES))

    async def expired_pending(self, limit: int = 1000) -> list[tuple[uuid.UUID, str]]:
        """PENDING tasks whose TTL has passed, oldest first: (task id, device)."""
        rows = await self.pool.fetch(
            "SELECT id, device FROM tasks WHERE status = 'PENDING' AND expires_at < now() "
            "ORDER BY expires_at LIMIT $1", limit)
        return [(r["id"], r["device"]) for r in rows]

    async def revive(self, task_ids: Sequence[uuid.UUID], detail: str, ttl_s: float) -> list[asyncpg.Record]:
        """Dead-lettered tasks become PENDING again, keeping their id and history, with fresh attempts and
        at least `ttl_s` to live; returns (id, device, type, priority, expires_at, caller) of those revived."""
        return await self.pool.fetch(
            """
            UPDATE tasks SET status = 'PENDING', attempts = 0, error = NULL, updated_at = now(),
                   enqueued_at = now(), expires_at = greatest(expires_at, now() + make_interval(secs => $3)),
                   history = history || jsonb_build_array(jsonb_build_object(
                       'status', 'PENDING', 'at', now(), 'attempt', 0, 'detail', $2::text))
            WHERE id = ANY($1::uuid[]) AND status = 'DEAD_LETTERED'
            RETURNING id, device, type, priority, expires_at, caller
            """, list(task_ids), detail, ttl_s)

    # --- rebuilding Redis --------------------------------------------------------------------------
    async def open_tasks(self, chunk: int = 5000) -> AsyncIterator[list[asyncpg.Record]]:
        """Every unfinished task, in the order it entered its queue, in chunks (a rebuild of Redis)."""
        async with self.pool.acquire() as conn, conn.transaction():
            cursor = conn.cursor(
                "SELECT id, device, type, priority, enqueued_at, expires_at, lease, attempts, trace_context, caller "
                "FROM tasks WHERE status = ANY($1::text[]) ORDER BY enqueued_at, created_at, id",
                list(OPEN_STATUSES), prefetch=chunk)
            rows: list[asyncpg.Record] = []
            async for row in cursor:
                rows.append(row)
                if len(rows) >= chunk:
                    yield rows
                    rows = []
            if rows:
                yield rows

    async def recent_dead_letters(self, limit: int) -> list[asyncpg.Record]:
        """The newest DEAD_LETTERED tasks (to refill the dead-letter list after Redis lost it)."""
        return await self.pool.fetch(
            "SELECT id, device, type, priority, error, attempts, enqueued_at, updated_at FROM tasks "
            "WHERE status = 'DEAD_LETTERED' ORDER BY updated_at DESC LIMIT $1", limit)

    # --- worker -------------------------------------------------------------------------------------
    async def start(self, worker_id: str,
                    hand_outs: Sequence[tuple[uuid.UUID, int, int, datetime]]) -> list[Started]:
        """Marks assigned tasks RUNNING for their hand-out (task id, lease, attempt, assigned at),
        recording ASSIGNED and RUNNING, and returns their payloads. Tasks already final, cancelled or
        handed out again since are left out. Safe to repeat for the same lease.

        Committed without waiting for the WAL flush (synchronous_commit off for this statement's own
        transaction): a RUNNING mark lost in a PostgreSQL crash leaves the task open, so it is queued
        again and the result of this hand-out is refused, never half-stored; and the result's commit,
        which does wait, flushes this earlier WAL with it."""
        rows = await self.pool.fetch(
            """
            UPDATE tasks t SET status = 'RUNNING', lease = u.lease, attempts = u.attempt, worker_id = $5,
                   updated_at = now(),
                   history = t.history || jsonb_build_array(
                       jsonb_build_object('status', 'ASSIGNED', 'at', u.assigned, 'attempt', u.attempt,
                                          'detail', $5::text),
                       jsonb_build_object('status', 'RUNNING', 'at', now(), 'attempt', u.attempt,
                                          'detail', $5::text))
            FROM unnest($1::uuid[], $2::int[], $3::int[], $4::timestamptz[]) AS u(id, lease, attempt, assigned),
                 (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
            WHERE t.id = u.id AND t.status = ANY($6::text[]) AND t.lease <= u.lease
            RETURNING t.id, t.type, u.lease, t.payload_text, t.payload_bytes, t.payload_url, t.trace_context
            """,
            [h[0] for h in hand_outs], [h[1] for h in hand_outs], [h[2] for h in hand_outs],
            [h[3] for h in hand_outs], worker_id, list(OPEN_STATUSES))
        return [Started(r["id"], r["type"], r["lease"], r["payload_text"], r["payload_bytes"],
                        r["payload_url"], r["trace_context"]) for r in rows]

    async def finish(self, outcomes: Sequence[Outcome]) -> set[uuid.UUID]:
        """Stores results and final statuses of many attempts in one transaction (group commit).

        Only the current attempt of a RUNNING task is stored (fencing): returns the ids stored; the
        others were refused (a newer attempt owns the task, or it was cancelled or already finished).
        One statement (status update and result insert in one CTE), hence one implicit transaction: no
        BEGIN/COMMIT round trips.
        """
        rows = await self.pool.fetch(
            """
            WITH u AS (
                SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[],
                                     $6::text[], $7::text[], $8::text[])
                     AS u(id, attempt, worker, verdict, hits, text, details, error)
            ), done AS (
                UPDATE tasks t SET
                    status = CASE WHEN u.verdict IS NULL THEN 'FAILED' ELSE 'SUCCEEDED' END,
                    error = u.error, updated_at = now(),
                    history = t.history || jsonb_build_array(jsonb_build_object(
                        'status', CASE WHEN u.verdict IS NULL THEN 'FAILED' ELSE 'SUCCEEDED' END,
                        'at', now(), 'attempt', t.attempts, 'detail', COALESCE(u.error, u.worker)))
                FROM u
                WHERE t.id = u.id AND t.status = 'RUNNING' AND t.lease = u.attempt
                RETURNING t.id
            ), stored AS (
                INSERT INTO results (task_id, verdict, hits, text, details, worker_id, attempt)
                SELECT u.id, u.verdict, u.hits::jsonb, u.text, u.details::jsonb, u.worker, u.attempt
                FROM u JOIN done ON done.id = u.id
                WHERE u.verdict IS NOT NULL
                ON CONFLICT (task_id) DO NOTHING
            )
            SELECT id FROM done
            """,
            [o.task_id for o in outcomes], [o.attempt for o in outcomes],
            [o.worker_id for o in outcomes], [o.verdict for o in outcomes],
            [o.hits_json for o in outcomes], [o.text for o in outcomes],
            [o.details_json for o in outcomes], [o.error for o in outcomes])
        return {r["id"] for r in rows}

    # --- reconciling Redis with this record (scheduler_svc/reconcile.py) -------------------------------
    async def reconcile_page(self, after: tuple[str, uuid.UUID] | None, limit: int,
                             grace_s: float) -> list[asyncpg.Record]:
        """(device, id, lease, updated_at) of the next `limit` open tasks after `after` in (device, id) order, of
        those unchanged for `grace_s`: one keyset page, an index-only scan of the partial index of open tasks
        (migration 0009), so a pass reads as many index entries as there are open tasks however many finished
        rows the table holds."""
        device, task_id = after or ("", uuid.UUID(int=0))
        async with self.pool.acquire() as conn, conn.transaction(readonly=True):
            # the page walks the index in key order; the planner, seeing few open tasks, may prefer another index
            # of open tasks and a sort of all of them, on every page: quadratic in open tasks over a pass
            await conn.execute(RECONCILE_PAGE_SETTINGS)
            return await conn.fetch(RECONCILE_PAGE_SQL, device, task_id, limit, grace_s)

    async def unchanged(self, seen: Sequence[tuple[uuid.UUID, int, datetime]]) -> list[asyncpg.Record]:
        """The rows of those of these tasks (id, lease, updated_at as a page read them) that are still open and
        unchanged since, with what queueing them again needs."""
        return await self.pool.fetch(
            f"""
            SELECT t.id, t.device, t.type, t.priority, t.status, t.caller, t.enqueued_at, t.expires_at, t.updated_at,
                   t.lease, t.attempts, t.trace_context
            FROM tasks t
            JOIN unnest($1::uuid[], $2::int[], $3::timestamptz[]) AS u(id, lease, updated) ON t.id = u.id
            WHERE t.status IN ({_OPEN_SQL}) AND t.lease = u.lease AND t.updated_at = u.updated
            """, [s[0] for s in seen], [s[1] for s in seen], [s[2] for s in seen])

    async def note_each(self, notes: Sequence[tuple[uuid.UUID, str]]) -> None:
        """Appends a remark of its own to each open task's history, without changing its status (one statement)."""
        await self.pool.execute(
            f"""
            UPDATE tasks t SET history = t.history || jsonb_build_array(jsonb_build_object(
                       'status', t.status, 'at', now(), 'attempt', t.attempts, 'detail', u.detail))
            FROM unnest($1::uuid[], $2::text[]) AS u(id, detail)
            WHERE t.id = u.id AND t.status IN ({_OPEN_SQL})
            """, [n[0] for n in notes], [n[1] for n in notes])


#: OPEN_STATUSES as SQL literals: a partial index over open tasks is used only when the planner can prove its
#: predicate from the query's own text (a parameter would not do for a generic plan)
_OPEN_SQL = ", ".join(f"'{s}'" for s in OPEN_STATUSES)

#: one keyset page of the reconciler ($1 device, $2 id: the last row of the previous page; $3 rows; $4 grace s):
#: only columns of the partial index tasks_open_device_id (migration 0009), read in its order
RECONCILE_PAGE_SQL = f"""
SELECT device, id, lease, updated_at
FROM tasks
WHERE status IN ({_OPEN_SQL}) AND (device, id) > ($1::text, $2::uuid)
  AND updated_at < now() - make_interval(secs => $4::float8)
ORDER BY device, id
LIMIT $3
"""
#: run before RECONCILE_PAGE_SQL in its transaction (see TaskStore.reconcile_page)
RECONCILE_PAGE_SETTINGS = "SET LOCAL enable_sort = off"
