"""The tasks table: every SQL statement that reads or changes a task or its result lives here.

Status changes append to the task's `history` (status, time, attempt, detail) in the same statement; entries
about a hand-out also carry its `lease` number and `worker`, and a put-back whether it `counted` and its
`retry_at`, so that each attempt can be told from the history (intake_svc/task_view.py). Writes come in
batches (`unnest` arrays), so one round trip serves many tasks.

Statements that find tasks by id are written so that the planner probes the primary key per id whatever the
statistics say: a lookup is a LATERAL subquery per id (LIMIT 1: it cannot be turned into a join); an update joins
its ids as `(... unnest(...) LIMIT $n)`, $n their number, which a prepared statement's generic plan takes for one
row (a LIMIT of unknown size), so that a primary-key probe per id beats one pass over the table; and the open
statuses come as a parameter (a literal list would let the planner use a partial index of open tasks, reading
every open task of the partition on each call). A plain join was planned, while a partition was young (a new
day's, or a new schema's: almost empty, not analyzed yet), as one pass over the whole partition, and a prepared
statement keeps its plan: each call then read every task of the day, more with every task added, until an ANALYZE
replanned it. Server CPU per call with plans cached while the partition held 20 tasks, then grown to 20 000
(20 ids a call, `finish` 40): `unfinished` 4.8 ms before, 0.2 ms after; `read_unmarked` 4.8 / 0.2; `start`
5.7 / 0.6; `finish` 6.1 / 1.3; `assigned` 5.6 / 0.7; `put_back` 12.1 / 0.9 — before, each grew with the partition.

The lifecycle of one hand-out, each step fenced by the lease number (it only grows):

- `assigned` (the scheduler, when it sends the task): PENDING -> ASSIGNED, for a newer lease than the row's;
- `start` (the worker, before running it): ASSIGNED -> RUNNING for the same lease, or straight to RUNNING (with
  ASSIGNED recorded at its real time) when the scheduler's write has not landed; refused once the lease was put back;
- `finish` (the worker): RUNNING -> SUCCEEDED / FAILED, only for the current lease;
- or, for a hand-out the worker runs without a RUNNING mark (the first attempt of a fast type: `Unmarked`),
  `read_unmarked` (its payload, under the same condition as `start`, writing nothing) and then `finish`, which
  moves it from PENDING or ASSIGNED straight to its final status under that condition, recording ASSIGNED and
  RUNNING at their real times in the same history: one row version for the run instead of two;
- `put_back` (the scheduler: nack, lease expired, execution timeout, worker gone, scheduler restart): back to
  PENDING with the reason and no worker id, for that lease or an older row; a late start or result of it is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from sieve.enums import enum_name
from sieve.fields import storable
from sieve.v1 import types_pb2
from sieve.v1.types_pb2 import TaskType

FINAL_STATUSES = ("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED", "DEAD_LETTERED")
OPEN_STATUSES = ("PENDING", "ASSIGNED", "RUNNING")
#: a batch of at least 2 × INSERT_PART_MIN tasks is recorded in up to INSERT_PARTS statements at once
INSERT_PARTS = 4
INSERT_PART_MIN = 200

log = logging.getLogger("sieve.db.tasks")


def type_value(name: str) -> int:
    return types_pb2.TaskType.Value("TASK_TYPE_" + name)


def status_value(name: str) -> int:
    return types_pb2.TaskStatus.Value("TASK_STATUS_" + name)


def ms_to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


#: the record of new tasks (TaskStore.insert_part): $1..$16 are arrays of equal length, one element per task
RECORD_SQL = """
    WITH u AS (
        SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::text[], $6::text[],
                             $7::text[], $8::bytea[], $9::text[], $10::timestamptz[], $11::timestamptz[],
                             $12::text[], $13::bytea[], $14::smallint[], $15::text[], $16::text[])
             WITH ORDINALITY
             AS u(id, device, type, priority, caller, key, text, image, url, created, expires, trace,
                  fingerprint, max_attempts, labels, callback_url, n)
    ), claimed AS (
        INSERT INTO idempotency_keys (caller, device, key, task_id, created_at)
        SELECT caller, device, key, id, created FROM u WHERE key IS NOT NULL ORDER BY n
        ON CONFLICT (caller, device, key) DO NOTHING
        RETURNING task_id
    )
    INSERT INTO tasks (id, device, type, priority, status, caller, idempotency_key, payload_text,
                       payload_bytes, payload_url, created_at, updated_at, expires_at, enqueued_at,
                       trace_context, fingerprint, max_attempts, labels, callback_url, history)
    SELECT u.id, u.device, u.type, u.priority, 'PENDING', u.caller, u.key, u.text, u.image, u.url,
           u.created, u.created, u.expires, u.created, u.trace, u.fingerprint, u.max_attempts,
           u.labels::jsonb, u.callback_url,
           jsonb_build_array(jsonb_build_object('status', 'PENDING', 'at', u.created,
                                                'attempt', 0, 'detail', 'accepted from ' || u.caller))
    FROM u
    WHERE u.key IS NULL OR u.id IN (SELECT task_id FROM claimed)
    ORDER BY u.n
    RETURNING id
"""
#: the arrays of a record of no task (warm_connection)
_NO_TASKS: tuple[list[object], ...] = tuple([] for _ in range(16))


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
    #: SHA-256 of the request (intake_svc.idempotency), set with an idempotency key
    fingerprint: bytes | None = None
    #: counted attempts after which it is dead-lettered (TaskSpec.max_attempts); None: the global setting
    max_attempts: int | None = None
    #: the caller's labels (TaskSpec.labels), None when it gave none
    labels: dict[str, str] | None = None
    #: where its completion is POSTed (TaskSpec.callback_url or the caller's default), None: nowhere
    callback_url: str | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """The row a NewTask ended up as: itself, or the earlier task with the same idempotency key."""

    task_id: uuid.UUID
    created: bool
    row: asyncpg.Record | None = None
    #: the earlier task was recorded for another request under the same key (nothing was changed)
    conflict: bool = False


@dataclass(frozen=True, slots=True)
class Unmarked:
    """A hand-out run without a RUNNING mark (`TaskStore.read_unmarked`): what its result write records for it
    instead (the attempt that counts, when it was assigned, when the worker started it)."""

    attempt: int
    assigned_at: datetime
    started_at: datetime


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
    #: set when it runs without a RUNNING mark (its Outcome carries it on)
    unmarked: Unmarked | None = None


@dataclass(frozen=True, slots=True)
class HandOut:
    """A task the scheduler sent to a worker (its ASSIGNED record)."""

    task_id: uuid.UUID
    lease: int
    #: the attempt that counts (failures so far + 1)
    attempt: int
    worker_id: str
    at: datetime


@dataclass(frozen=True, slots=True)
class PutBack:
    """A hand-out the scheduler took back, and why."""

    task_id: uuid.UUID
    lease: int
    worker_id: str
    reason: str
    counted: bool
    #: when it may run again (None: at once)
    retry_at: datetime | None = None


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
    #: the hand-out ran without a RUNNING mark (Started.unmarked): the result write records it
    unmarked: Unmarked | None = None


def _parts_by_device(tasks: Sequence[NewTask], most: int, least: int) -> list[list[NewTask]]:
    """`tasks` in at most `most` parts of at least about `least` tasks, each device's tasks in one part (in their
    order); parts are filled greedily by device so that they come out about the same size."""
    count = min(most, len(tasks) // least)
    if count <= 1:
        return [list(tasks)]
    by_device: dict[str, list[NewTask]] = {}
    for t in tasks:
        by_device.setdefault(t.device, []).append(t)
    if len(by_device) == 1:
        return [list(tasks)]
    parts: list[list[NewTask]] = [[] for _ in range(count)]
    for group in sorted(by_device.values(), key=len, reverse=True):
        min(parts, key=len).extend(group)
    return [p for p in parts if p]


class TaskStore:
    """Reads and writes tasks and results through one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # --- intake ---------------------------------------------------------------------------------
    @staticmethod
    async def warm_connection(conn: asyncpg.Connection) -> None:
        """Prepares the record statement on a new connection (a record of no task: nothing is written), so that
        the first batch a connection records does not also pay for parsing and planning it while the machine is
        busy. Skipped, and tried again on first use, while the schema is not migrated yet."""
        try:
            await conn.fetch(RECORD_SQL, *_NO_TASKS)
        except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError, asyncpg.InvalidSchemaNameError):
            log.debug("record statement not prepared: the schema is not migrated yet")

    async def insert(self, tasks: Sequence[NewTask]) -> list[Recorded]:
        """Records new tasks (status PENDING), as `insert_part` says; a large batch is split by device into at
        most INSERT_PARTS parts written at once on their own connections, since one statement's index and trigger
        work runs on one PostgreSQL core. All or nothing as one statement is: when a part fails, the rows the
        others created are withdrawn before the error is raised. A device's tasks (and so its idempotency keys)
        stay in one part."""
        parts = _parts_by_device(tasks, INSERT_PARTS, INSERT_PART_MIN)
        if len(parts) == 1:
            return await self.insert_part(tasks)
        done = await asyncio.gather(*(self.insert_part(part) for part in parts), return_exceptions=True)
        failed = [d for d in done if isinstance(d, BaseException)]
        if failed:
            created = [r.task_id for d in done if not isinstance(d, BaseException) for r in d if r.created]
            if created:
                try:
                    await self.withdraw(created)
                except Exception:  # left PENDING and unqueued: the reconciler queues them
                    log.exception("could not withdraw %d rows of a partly recorded batch", len(created))
            raise failed[0]
        recorded: dict[uuid.UUID, Recorded] = {}
        for part, rows in zip(parts, done, strict=True):
            assert not isinstance(rows, BaseException)
            recorded.update((t.task_id, r) for t, r in zip(part, rows, strict=True))
        return [recorded[t.task_id] for t in tasks]

    async def insert_part(self, tasks: Sequence[NewTask]) -> list[Recorded]:
        """Records new tasks (status PENDING) in one statement; a repeated idempotency key returns the
        earlier task instead of creating one (`conflict` when its stored fingerprint differs from the new
        task's: another request under the same key). Tasks without a key cost no further round trip; the
        earlier tasks of repeated keys are read in one more.

        Keys live in `idempotency_keys` (one row per caller, device and key; `tasks` is partitioned by id, so
        it cannot hold a unique index on them): the same statement claims each key and inserts only the tasks
        whose key it claimed, or that have none."""
        rows = await self.pool.fetch(
            RECORD_SQL,
            [t.task_id for t in tasks],
            [t.device for t in tasks],
            [enum_name(TaskType, t.task_type) for t in tasks],
            [t.priority for t in tasks],
            [t.caller for t in tasks],
            [t.idempotency_key for t in tasks],
            [t.text for t in tasks],
            [t.image for t in tasks],
            [t.image_url for t in tasks],
            [t.created_at for t in tasks],
            [t.expires_at for t in tasks],
            [t.trace_context for t in tasks],
            [t.fingerprint for t in tasks],
            [t.max_attempts for t in tasks],
            [None if t.labels is None else json.dumps(t.labels, ensure_ascii=False) for t in tasks],
            [t.callback_url for t in tasks],
        )
        created = {r["id"] for r in rows}
        repeated = [t for t in tasks if t.task_id not in created]
        earlier: dict[tuple[str, str, str], asyncpg.Record] = {}
        if repeated:
            found = await self.pool.fetch(
                """
                SELECT t.* FROM unnest($1::text[], $2::text[], $3::text[]) AS u(caller, device, key)
                JOIN idempotency_keys k ON k.caller = u.caller AND k.device = u.device AND k.key = u.key
                JOIN tasks t ON t.id = k.task_id
                """,
                [t.caller for t in repeated],
                [t.device for t in repeated],
                [t.idempotency_key for t in repeated],
            )
            earlier = {(r["caller"], r["device"], r["idempotency_key"]): r for r in found}
        out: list[Recorded] = []
        for t in tasks:
            if t.task_id in created:
                out.append(Recorded(t.task_id, True))
                continue
            existing = earlier.get((t.caller, t.device, t.idempotency_key or ""))
            if existing is None:
                # the earlier task was withdrawn meanwhile, or deleted by retention before its key: forget a
                # key whose task is gone and record this one
                await self.pool.execute(
                    "DELETE FROM idempotency_keys k WHERE caller = $1 AND device = $2 AND key = $3 "
                    "AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = k.task_id)",
                    t.caller,
                    t.device,
                    t.idempotency_key,
                )
                again = await self.insert_part([t])
                out.append(again[0])
            else:
                stored = existing["fingerprint"]
                conflict = stored is not None and t.fingerprint is not None and bytes(stored) != t.fingerprint
                out.append(Recorded(existing["id"], False, existing, conflict=conflict))
        return out

    async def withdraw(self, task_ids: Sequence[uuid.UUID]) -> None:
        """Removes tasks that were recorded but could not be queued (the caller was told no), with their
        idempotency keys."""
        await self.pool.execute(
            """
            WITH gone AS (
                DELETE FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'PENDING' AND attempts = 0
                RETURNING id, caller, device, idempotency_key
            )
            DELETE FROM idempotency_keys k USING gone g
            WHERE k.caller = g.caller AND k.device = g.device AND k.key = g.idempotency_key AND k.task_id = g.id
            """,
            list(task_ids),
        )

    # --- reading ----------------------------------------------------------------------------------
    async def get(self, task_id: uuid.UUID) -> tuple[asyncpg.Record, asyncpg.Record | None] | None:
        row = await self.pool.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
        if row is None:
            return None
        result = await self.pool.fetchrow("SELECT * FROM results WHERE task_id = $1", task_id)
        return row, result

    async def max_attempts_of(self, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """The tasks' own limits of counted attempts (TaskSpec.max_attempts), for those that have one."""
        rows = await self.pool.fetch(
            "SELECT id, max_attempts FROM tasks WHERE id = ANY($1::uuid[]) AND max_attempts IS NOT NULL", list(task_ids)
        )
        return {r["id"]: r["max_attempts"] for r in rows}

    async def unfinished(self, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        """Which of these tasks are not final, with the lease PostgreSQL records for each (one primary-key probe per
        id; acks are checked against it).

        A probe per unnested id, not `id = ANY($1)`: against the table partitioned by id, `= ANY` of a parameter
        makes the planner prefer a custom plan (it prunes partitions at planning) and so plan every call anew, which
        cost several times the lookup itself on every ack; this plan is the same whatever the ids, so the prepared
        statement keeps its generic plan (partitions are pruned per id as it runs); see the module on the probe."""
        rows = await self.pool.fetch(
            "SELECT u.id, t.lease FROM unnest($1::uuid[]) AS u(id) CROSS JOIN LATERAL "
            "(SELECT lease FROM tasks WHERE id = u.id AND status = ANY($2::text[]) LIMIT 1) t",
            list(task_ids),
            list(OPEN_STATUSES),
        )
        return {r["id"]: int(r["lease"] or 0) for r in rows}

    async def pending_by_class(self) -> list[tuple[int, str, int]]:
        """(priority, type, count) of PENDING tasks (metrics; the partial index on PENDING keeps it cheap)."""
        rows = await self.pool.fetch(
            "SELECT priority, type, count(*) AS n FROM tasks WHERE status = 'PENDING' GROUP BY priority, type"
        )
        return [(r["priority"], r["type"], r["n"]) for r in rows]

    # --- status changes -----------------------------------------------------------------------------
    async def transition(
        self,
        task_ids: Sequence[uuid.UUID],
        status: str,
        detail: str,
        *,
        error: str | None = None,
        only_from: Sequence[str] = OPEN_STATUSES,
        conn: Any = None,
    ) -> list[uuid.UUID]:
        """Moves open tasks to `status`, appending to their history; returns those that moved."""
        rows = await (conn or self.pool).fetch(
            """
            UPDATE tasks SET status = $2, updated_at = now(), error = COALESCE($4, error),
                   history = history || jsonb_build_array(jsonb_build_object(
                       'status', $2::text, 'at', now(), 'attempt', attempts, 'lease', lease, 'detail', $3::text))
            WHERE id = ANY($1::uuid[]) AND status = ANY($5::text[])
            RETURNING id
            """,
            list(task_ids),
            status,
            detail,
            error,
            list(only_from),
        )
        return [r["id"] for r in rows]

    async def note(self, task_ids: Sequence[uuid.UUID], detail: str) -> None:
        """Appends a remark (e.g. a routing decision) to open tasks' history without changing status."""
        await self.pool.execute(
            """
            UPDATE tasks SET history = history || jsonb_build_array(jsonb_build_object(
                       'status', status, 'at', now(), 'attempt', attempts, 'detail', $2::text))
            WHERE id = ANY($1::uuid[]) AND status = ANY($3::text[])
            """,
            list(task_ids),
            detail,
            list(OPEN_STATUSES),
        )

    async def expired_pending(self, limit: int = 1000) -> list[tuple[uuid.UUID, str]]:
        """PENDING tasks whose TTL has passed, oldest first: (task id, device)."""
        rows = await self.pool.fetch(
            "SELECT id, device FROM tasks WHERE status = 'PENDING' AND expires_at < now() ORDER BY expires_at LIMIT $1",
            limit,
        )
        return [(r["id"], r["device"]) for r in rows]

    async def revive(self, task_ids: Sequence[uuid.UUID], detail: str, ttl_s: float) -> list[asyncpg.Record]:
        """Dead-lettered tasks become PENDING again, keeping their id and history, with fresh attempts and
        at least `ttl_s` to live; returns (id, device, type, priority, expires_at, caller, lease) of those revived
        (their next hand-out must be numbered above `lease`)."""
        return await self.pool.fetch(
            """
            UPDATE tasks SET status = 'PENDING', attempts = 0, error = NULL, updated_at = now(),
                   enqueued_at = now(), expires_at = greatest(expires_at, now() + make_interval(secs => $3)),
                   history = history || jsonb_build_array(jsonb_build_object(
                       'status', 'PENDING', 'at', now(), 'attempt', 0, 'detail', $2::text))
            WHERE id = ANY($1::uuid[]) AND status = 'DEAD_LETTERED'
            RETURNING id, device, type, priority, expires_at, caller, lease
            """,
            list(task_ids),
            detail,
            ttl_s,
        )

    # --- rebuilding Redis --------------------------------------------------------------------------
    async def open_tasks(self, chunk: int = 5000) -> AsyncIterator[list[asyncpg.Record]]:
        """Every unfinished task, in the order it entered its queue, in chunks (a rebuild of Redis)."""
        async with self.pool.acquire() as conn, conn.transaction():
            cursor = conn.cursor(
                "SELECT id, device, type, priority, enqueued_at, expires_at, lease, attempts, trace_context, caller "
                "FROM tasks WHERE status = ANY($1::text[]) ORDER BY enqueued_at, created_at, id",
                list(OPEN_STATUSES),
                prefetch=chunk,
            )
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
            "WHERE status = 'DEAD_LETTERED' ORDER BY updated_at DESC LIMIT $1",
            limit,
        )

    # --- worker -------------------------------------------------------------------------------------
    async def start(self, worker_id: str, hand_outs: Sequence[tuple[uuid.UUID, int, int, datetime]]) -> list[Started]:
        """Marks assigned tasks RUNNING for their hand-out (task id, lease, attempt, assigned at) and returns their
        payloads: ASSIGNED -> RUNNING when the scheduler's ASSIGNED write landed, else straight to RUNNING with
        ASSIGNED recorded at its real time. Tasks already final, cancelled, handed out again since, or whose
        hand-out was put back (a lease that expired, a timeout) are left out. Safe to repeat for the same lease
        (the repeat changes nothing).

        Committed without waiting for the WAL flush (synchronous_commit off for this statement's own
        transaction): a RUNNING mark lost in a PostgreSQL crash leaves the task open, so it is queued
        again and the result of this hand-out is refused, never half-stored; and the result's commit,
        which does wait, flushes this earlier WAL with it."""
        rows = await self.pool.fetch(
            """
            UPDATE tasks t SET status = 'RUNNING', lease = u.lease, attempts = u.attempt, worker_id = $5,
                   updated_at = now(),
                   history = t.history || CASE
                       WHEN t.lease < u.lease THEN jsonb_build_array(
                           jsonb_build_object('status', 'ASSIGNED', 'at', u.assigned, 'attempt', u.attempt,
                                              'lease', u.lease, 'worker', $5::text, 'detail', $5::text),
                           jsonb_build_object('status', 'RUNNING', 'at', now(), 'attempt', u.attempt,
                                              'lease', u.lease, 'worker', $5::text, 'detail', $5::text))
                       WHEN t.status = 'ASSIGNED' THEN jsonb_build_array(
                           jsonb_build_object('status', 'RUNNING', 'at', now(), 'attempt', u.attempt,
                                              'lease', u.lease, 'worker', $5::text, 'detail', $5::text))
                       ELSE '[]'::jsonb END
            FROM (SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::timestamptz[]) LIMIT $7)
                     AS u(id, lease, attempt, assigned),
                 (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
            WHERE t.id = u.id AND t.status = ANY($6::text[])
              AND (t.lease < u.lease OR (t.lease = u.lease AND t.status IN ('ASSIGNED', 'RUNNING')))
            RETURNING t.id, t.type, u.lease, t.payload_text, t.payload_bytes, t.payload_url, t.trace_context
            """,
            [h[0] for h in hand_outs],
            [h[1] for h in hand_outs],
            [h[2] for h in hand_outs],
            [h[3] for h in hand_outs],
            worker_id,
            list(OPEN_STATUSES),
            len(hand_outs),
        )
        return [
            Started(
                r["id"],
                r["type"],
                r["lease"],
                r["payload_text"],
                r["payload_bytes"],
                r["payload_url"],
                r["trace_context"],
            )
            for r in rows
        ]

    async def read_unmarked(self, hand_outs: Sequence[tuple[uuid.UUID, int, int, datetime]]) -> list[Started]:
        """The payloads of hand-outs (task id, lease, attempt, assigned at) that a worker runs without a RUNNING mark,
        for those `start` would hand back (the same condition: not final nor cancelled, not handed out again since,
        not put back); writes nothing. Their `finish` then records the run (see the module)."""
        rows = await self.pool.fetch(
            """
            SELECT u.id, t.type, u.lease, u.attempt, u.assigned, t.payload_text, t.payload_bytes, t.payload_url,
                   t.trace_context
            FROM unnest($1::uuid[], $2::int[], $3::int[], $4::timestamptz[]) AS u(id, lease, attempt, assigned)
            CROSS JOIN LATERAL (
                SELECT type, payload_text, payload_bytes, payload_url, trace_context FROM tasks
                WHERE id = u.id AND status = ANY($5::text[])
                  AND (lease < u.lease OR (lease = u.lease AND status IN ('ASSIGNED', 'RUNNING')))
                LIMIT 1
            ) t
            """,
            [h[0] for h in hand_outs],
            [h[1] for h in hand_outs],
            [h[2] for h in hand_outs],
            [h[3] for h in hand_outs],
            list(OPEN_STATUSES),
        )
        now = datetime.now(UTC)
        return [
            Started(
                r["id"],
                r["type"],
                r["lease"],
                r["payload_text"],
                r["payload_bytes"],
                r["payload_url"],
                r["trace_context"],
                Unmarked(r["attempt"], r["assigned"], now),
            )
            for r in rows
        ]

    async def assigned(self, hand_outs: Sequence[HandOut]) -> int:
        """Records hand-outs as they are sent: open tasks become ASSIGNED to their worker, for a lease newer than
        the row's (a worker's start that got there first, or a put-back of that lease, wins). Returns how many
        moved. Rows another transaction holds are skipped, never waited for (that is a worker starting them, whose
        start records ASSIGNED itself): the scheduler's many-row writes cannot deadlock with the workers'. Not
        flushed to the WAL before it returns (as `start`): losing it loses a status, never a task."""
        result = await self.pool.execute(
            """
            WITH u AS (
                SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::text[], $5::timestamptz[])
                     AS u(id, lease, attempt, worker, at) LIMIT $7
            ), free AS (
                SELECT t.id FROM tasks t JOIN u ON t.id = u.id
                WHERE t.status = ANY($6::text[]) AND t.lease < u.lease
                FOR UPDATE OF t SKIP LOCKED
            )
            UPDATE tasks t SET status = 'ASSIGNED', lease = u.lease, attempts = u.attempt, worker_id = u.worker,
                   updated_at = now(),
                   history = t.history || jsonb_build_array(jsonb_build_object(
                       'status', 'ASSIGNED', 'at', u.at, 'attempt', u.attempt, 'lease', u.lease, 'worker', u.worker,
                       'detail', u.worker))
            FROM u, (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
            WHERE t.id = u.id AND t.id IN (SELECT id FROM free)
              AND t.status = ANY($6::text[]) AND t.lease < u.lease
            """,
            [h.task_id for h in hand_outs],
            [h.lease for h in hand_outs],
            [h.attempt for h in hand_outs],
            [h.worker_id for h in hand_outs],
            [h.at for h in hand_outs],
            list(OPEN_STATUSES),
            len(hand_outs),
        )
        return int(result.rpartition(" ")[2] or 0)

    async def put_back(self, items: Sequence[PutBack]) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        """Tasks whose hand-out was taken back (nacked, lease expired, execution timeout, worker gone, scheduler
        restart) are PENDING again, without a worker id, with the reason (and whether it counted, and when it may
        run again) in their history — for that lease, or a row that had not heard of it yet; a newer hand-out or
        a final status is left alone. A late start or result of that lease is refused afterwards (start needs a
        newer lease or the same one ASSIGNED / RUNNING; finish needs RUNNING).

        Rows another transaction holds (a worker writing them) are skipped, not waited for, so that this many-row
        write cannot deadlock with the workers'. Returns (ids that moved, ids skipped so: try them again)."""
        rows = await self.pool.fetch(
            """
            WITH u AS (
                SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::bool[], $6::timestamptz[])
                     AS u(id, lease, worker, reason, counted, retry_at) LIMIT $8
            ), free AS (
                SELECT t.id FROM tasks t JOIN u ON t.id = u.id
                WHERE t.status = ANY($7::text[]) AND t.lease <= u.lease
                FOR UPDATE OF t SKIP LOCKED
            ), moved AS (
                UPDATE tasks t SET status = 'PENDING', worker_id = NULL, lease = u.lease, updated_at = now(),
                       history = t.history || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                           'status', 'PENDING', 'at', now(), 'attempt', t.attempts, 'lease', u.lease,
                           'worker', u.worker, 'detail', u.reason, 'counted', u.counted, 'retry_at', u.retry_at)))
                FROM u
                WHERE t.id = u.id AND t.id IN (SELECT id FROM free)
                  AND t.status = ANY($7::text[]) AND t.lease <= u.lease
                RETURNING t.id
            )
            SELECT id, true AS moved FROM moved
            UNION ALL
            SELECT t.id, false FROM tasks t JOIN u ON t.id = u.id
            WHERE t.status = ANY($7::text[]) AND t.lease <= u.lease
              AND t.id NOT IN (SELECT id FROM free)
            """,
            [i.task_id for i in items],
            [i.lease for i in items],
            [i.worker_id for i in items],
            [i.reason for i in items],
            [i.counted for i in items],
            [i.retry_at for i in items],
            list(OPEN_STATUSES),
            len(items),
        )
        return [r["id"] for r in rows if r["moved"]], [r["id"] for r in rows if not r["moved"]]

    async def finish(self, outcomes: Sequence[Outcome]) -> set[uuid.UUID]:
        """Stores results and final statuses of many attempts in one transaction (group commit).

        Only the current attempt is stored (fencing): for a RUNNING task, the lease its mark recorded; for a hand-out
        run without a mark (`Outcome.unmarked`), the condition `start` applies (a newer lease than the row's, or the
        same one ASSIGNED) — the task then goes straight to its final status, its history getting ASSIGNED (unless
        the scheduler's record landed) and RUNNING at their real times before it. Returns the ids stored; the others
        were refused (a newer attempt owns the task, it was put back, cancelled or already finished). One statement
        (status update and result insert in one CTE), hence one implicit transaction: no BEGIN/COMMIT round trips.
        """
        rows = await self.pool.fetch(
            """
            WITH u AS (
                SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[],
                                     $6::text[], $7::text[], $8::text[], $9::int[], $10::timestamptz[],
                                     $11::timestamptz[])
                     AS u(id, attempt, worker, verdict, hits, text, details, error, counted, assigned, started)
                LIMIT $13
            ), done AS (
                UPDATE tasks t SET
                    status = CASE WHEN u.verdict IS NULL THEN 'FAILED' ELSE 'SUCCEEDED' END,
                    error = u.error, updated_at = now(), lease = u.attempt,
                    attempts = COALESCE(u.counted, t.attempts), worker_id = u.worker,
                    history = t.history || CASE
                        WHEN u.counted IS NULL THEN '[]'::jsonb
                        WHEN t.lease < u.attempt THEN jsonb_build_array(
                            jsonb_build_object('status', 'ASSIGNED', 'at', u.assigned, 'attempt', u.counted,
                                               'lease', u.attempt, 'worker', u.worker, 'detail', u.worker),
                            jsonb_build_object('status', 'RUNNING', 'at', u.started, 'attempt', u.counted,
                                               'lease', u.attempt, 'worker', u.worker, 'detail', u.worker))
                        WHEN t.status = 'ASSIGNED' THEN jsonb_build_array(
                            jsonb_build_object('status', 'RUNNING', 'at', u.started, 'attempt', u.counted,
                                               'lease', u.attempt, 'worker', u.worker, 'detail', u.worker))
                        ELSE '[]'::jsonb END || jsonb_build_array(jsonb_build_object(
                        'status', CASE WHEN u.verdict IS NULL THEN 'FAILED' ELSE 'SUCCEEDED' END,
                        'at', now(), 'attempt', COALESCE(u.counted, t.attempts), 'lease', u.attempt,
                        'worker', u.worker, 'detail', COALESCE(u.error, u.worker)))
                FROM u
                WHERE t.id = u.id AND t.status = ANY($12::text[])
                  AND CASE WHEN u.counted IS NULL THEN t.status = 'RUNNING' AND t.lease = u.attempt
                           ELSE t.lease < u.attempt OR (t.lease = u.attempt AND t.status IN ('ASSIGNED', 'RUNNING'))
                      END
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
            [o.task_id for o in outcomes],
            [o.attempt for o in outcomes],
            [o.worker_id for o in outcomes],
            [o.verdict for o in outcomes],
            [o.hits_json for o in outcomes],
            [o.text for o in outcomes],
            [o.details_json for o in outcomes],
            [None if o.error is None else storable(o.error) for o in outcomes],
            [None if o.unmarked is None else o.unmarked.attempt for o in outcomes],
            [None if o.unmarked is None else o.unmarked.assigned_at for o in outcomes],
            [None if o.unmarked is None else o.unmarked.started_at for o in outcomes],
            list(OPEN_STATUSES),
            len(outcomes),
        )
        return {r["id"] for r in rows}

    # --- reconciling Redis with this record (scheduler_svc/reconcile.py) -------------------------------
    async def reconcile_page(
        self, after: tuple[str, uuid.UUID] | None, limit: int, grace_s: float
    ) -> list[asyncpg.Record]:
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
            """,
            [s[0] for s in seen],
            [s[1] for s in seen],
            [s[2] for s in seen],
        )

    async def note_each(self, notes: Sequence[tuple[uuid.UUID, str]]) -> None:
        """Appends a remark of its own to each open task's history, without changing its status (one statement)."""
        await self.pool.execute(
            f"""
            UPDATE tasks t SET history = t.history || jsonb_build_array(jsonb_build_object(
                       'status', t.status, 'at', now(), 'attempt', t.attempts, 'detail', u.detail))
            FROM unnest($1::uuid[], $2::text[]) AS u(id, detail)
            WHERE t.id = u.id AND t.status IN ({_OPEN_SQL})
            """,
            [n[0] for n in notes],
            [n[1] for n in notes],
        )


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
