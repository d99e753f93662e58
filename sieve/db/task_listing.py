"""ListTasks' query: a caller's tasks (or one device's, or every task for an operator), newest first, filtered,
in keyset pages.

A page is one statement. Its window is a range scan of an index in id order — (caller, id) or (device, id)
(migration 0012), or the primary key when neither is named — below the last id of the page before, of at most
`MAX_EXAMINED` tasks; the filters that no index serves (statuses, type, labels, verdict, created-at bounds) hold
in that window, and the first `page_size` tasks that pass are the page. A page that is not full while the window
was (very selective filters) ends at the window's last id: the next page goes on from there, so that no call
reads more than `MAX_EXAMINED` index entries, whatever the filters. Ids are UUIDv7, so created-at bounds are also
id bounds (`uuid7_floor`), which narrow the scan itself.

The SQL is put together from fixed fragments for the filters that are set (so that each shape gets a plan that
uses its index); every value is a parameter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from sieve.ids import datetime_ms, uuid7_floor

#: the most tasks one page's statement looks at
MAX_EXAMINED = 10_000
#: what a listed task shows (no payloads: an image can be 10 MiB; no history: GetTask has it)
COLUMNS = (
    "t.id, t.device, t.type, t.priority, t.status, t.caller, t.attempts, t.created_at, t.updated_at, t.expires_at,"
    " t.error, t.idempotency_key, t.max_attempts, t.labels, '[]'::jsonb AS history"
)


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """What to list: `caller` None lists every caller's (operators); every other filter that is set must hold."""

    caller: str | None = None
    device: str | None = None
    statuses: Sequence[str] = ()
    task_type: str | None = None
    verdict: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class TaskPage:
    """A page: its task rows and their results (by task id), and where the next page starts (None: the last)."""

    rows: list[asyncpg.Record]
    results: dict[uuid.UUID, asyncpg.Record]
    next_below: uuid.UUID | None


class _Params:
    """The statement's parameters, numbered as they are added."""

    def __init__(self) -> None:
        self.values: list[object] = []

    def __call__(self, value: object) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def _window(query: TaskQuery, below: uuid.UUID | None, arg: _Params) -> list[str]:
    """The conditions an index range serves: caller, device, the id bounds (the page's start, created-at)."""
    conditions: list[str] = []
    if query.caller is not None:
        conditions.append(f"t.caller = {arg(query.caller)}")
    if query.device is not None:
        conditions.append(f"t.device = {arg(query.device)}")
    upper = below
    if query.created_before is not None:
        before = uuid7_floor(datetime_ms(query.created_before) + 1)  # ids of that millisecond may pass, then
        upper = before if upper is None or before < upper else upper  # the created_at test decides
    if upper is not None:
        conditions.append(f"t.id < {arg(upper)}::uuid")
    if query.created_after is not None:
        conditions.append(f"t.id >= {arg(uuid7_floor(datetime_ms(query.created_after)))}::uuid")
    return conditions


def _passes(query: TaskQuery, arg: _Params) -> list[str]:
    """The conditions tested on the window's rows."""
    conditions: list[str] = []
    if query.statuses:
        conditions.append(f"w.status = ANY({arg(list(query.statuses))}::text[])")
    if query.task_type is not None:
        conditions.append(f"w.type = {arg(query.task_type)}")
    if query.labels:
        conditions.append(f"w.labels @> {arg(json.dumps(dict(query.labels), ensure_ascii=False))}::text::jsonb")
    if query.created_after is not None:
        conditions.append(f"w.created_at >= {arg(query.created_after)}")
    if query.created_before is not None:
        conditions.append(f"w.created_at < {arg(query.created_before)}")
    if query.verdict is not None:
        conditions.append(
            f"EXISTS (SELECT 1 FROM results r WHERE r.task_id = w.id AND r.verdict = {arg(query.verdict)})"
        )
    return conditions


def statement(query: TaskQuery, page_size: int, below: uuid.UUID | None = None) -> tuple[str, list[object]]:
    """The SQL of one page and its parameters."""
    arg = _Params()
    window = _window(query, below, arg)
    limit = arg(MAX_EXAMINED)
    passes = _passes(query, arg)
    page = arg(page_size)
    sql = f"""
        WITH w AS MATERIALIZED (
            SELECT {COLUMNS} FROM tasks t
            {"WHERE " + " AND ".join(window) if window else ""}
            ORDER BY t.id DESC
            LIMIT {limit}
        ), edge AS (SELECT (SELECT id FROM w ORDER BY id LIMIT 1) AS last, (SELECT count(*) FROM w) AS seen)
        SELECT w.*, edge.last AS window_last, edge.seen AS window_seen
        FROM edge LEFT JOIN w ON {" AND ".join(passes) if passes else "true"}
        ORDER BY w.id DESC NULLS LAST
        LIMIT {page}
    """
    return sql, arg.values


async def list_tasks(pool: asyncpg.Pool, query: TaskQuery, page_size: int, below: uuid.UUID | None = None) -> TaskPage:
    """One page of `query`: tasks with an id below `below` (None: from the newest), newest first."""
    sql, args = statement(query, page_size, below)
    fetched = await pool.fetch(sql, *args)
    rows = [r for r in fetched if r["id"] is not None]  # (a window where nothing passed gives one empty row)
    next_below: uuid.UUID | None = None
    if len(rows) >= page_size:
        next_below = rows[-1]["id"]
    elif fetched and fetched[0]["window_seen"] >= MAX_EXAMINED:  # the window was full: below it is not read yet
        next_below = fetched[0]["window_last"]
    results: dict[uuid.UUID, asyncpg.Record] = {}
    if rows:
        found = await pool.fetch("SELECT * FROM results WHERE task_id = ANY($1::uuid[])", [r["id"] for r in rows])
        results = {r["task_id"]: r for r in found}
    return TaskPage(rows, results, next_below)
