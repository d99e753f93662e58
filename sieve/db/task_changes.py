"""The change feed of tasks (migration 0014 `task_changes`): what WatchTask streams, read so that no change is
skipped or repeated however late its transaction commits.

Row ids are handed out when a change is made, not when it commits, so "every id above the last one seen" would
skip a change that commits after a later id was read. A reader instead remembers the snapshot it read under: the
rows that snapshot could not see — of the transactions running then (its xip list) and of later ones (from its
xmax) — are exactly the rows still to come. A `Position` is that snapshot `seen` and, while a read was cut short
by its limit, the snapshot `reading` it was cut under and the last id it reached (rows are read in id order):

- `Position(S, S, 0)`: every change S sees was delivered; next come the rows S does not see;
- `Position(P, C, L)`: every change P sees, and those C sees with an id up to L; next come the rest of what C sees
  (ids above L), then what C does not see.

One task's changes are in id order and commit order alike (its row lock orders the statements that change it), so
each task's changes come in their real order. A `Position` is what a WatchTask cursor carries (intake_svc/watch.py).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

#: pg_snapshot's text form: xmin:xmax:xip,xip,...
_SNAPSHOT = re.compile(r"^(\d{1,19}):(\d{1,19}):((?:\d{1,19})(?:,\d{1,19})*)?$")
#: the most transactions a snapshot's xip list may name in a cursor (PostgreSQL's own bound is max_connections-ish)
MAX_XIP = 10_000


class BadPosition(ValueError):
    """A cursor's snapshot or id is not well formed."""


def check_snapshot(text: str) -> str:
    """`text` when it is a well-formed pg_snapshot (xmin <= every xip < xmax); BadPosition otherwise."""
    m = _SNAPSHOT.match(text)
    if m is None:
        raise BadPosition("not a snapshot")
    xmin, xmax = int(m.group(1)), int(m.group(2))
    xip = [int(x) for x in m.group(3).split(",")] if m.group(3) else []
    if len(xip) > MAX_XIP or xmin > xmax or any(not xmin <= x < xmax for x in xip) or xmax >= 2**63:
        raise BadPosition("not a snapshot")
    return text


def snapshot_xmin(text: str) -> int:
    return int(text.split(":", 1)[0])


@dataclass(frozen=True, slots=True)
class Position:
    """Where a reader of the feed stands (see the module's text)."""

    seen: str
    reading: str
    last_id: int = 0
    #: of row `last_id`, the entries delivered so far (their indexes 0..upto); None: all of them
    upto: int | None = None

    @classmethod
    def at(cls, snapshot: str) -> Position:
        return cls(snapshot, snapshot, 0)

    @property
    def from_id(self) -> int:
        """The first row id still (partly) to come."""
        return self.last_id + 1 if self.upto is None else self.last_id

    @property
    def between_reads(self) -> bool:
        return self.seen == self.reading


@dataclass(frozen=True, slots=True)
class Change:
    """One status change of a task, as recorded."""

    #: the feed row it is in, and its index among that row's entries
    id: int
    index: int
    task_id: uuid.UUID
    caller: str
    device: str
    seq: int
    status: str
    at: datetime
    attempt: int
    detail: str
    #: the result's verdict of a SUCCEEDED change (None otherwise)
    verdict: str | None


@dataclass(frozen=True, slots=True)
class ChangeFilter:
    """Which changes a watcher wants: of one caller (None: every caller's), and optionally of these tasks, this
    device, tasks carrying these labels."""

    caller: str | None
    task_ids: Sequence[uuid.UUID] = ()
    device: str | None = None
    labels: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ChangePage:
    changes: list[Change]
    #: where the reader stands after these changes
    position: Position
    #: the snapshot these changes were read up to (a change's own position: `seen`, this, its id)
    reading: str
    #: the read stopped at its limit: more may be read at once
    cut: bool


#: the index of a change among its feed row's: its task's place in the row x ENTRY_SPAN + the entry's in that task's
ENTRY_SPAN = 10_000


def _where(scope: ChangeFilter, first: int) -> tuple[str, list[object]]:
    """The filter's conditions on an item `i.item` of a feed row (parameters numbered from `first`)."""
    parts: list[str] = []
    args: list[object] = []
    if scope.caller is not None:
        args.append(scope.caller)
        parts.append(f"i.item->>'c' = ${first + len(args) - 1}")
    if scope.task_ids:
        args.append([str(t) for t in scope.task_ids])
        parts.append(f"i.item->>'t' = ANY(${first + len(args) - 1}::text[])")
    if scope.device is not None:
        args.append(scope.device)
        parts.append(f"i.item->>'d' = ${first + len(args) - 1}")
    if scope.labels:
        args.append(scope.labels)  # the pool's jsonb codec encodes it (sieve/db/__init__.py)
        parts.append(
            "EXISTS (SELECT 1 FROM tasks t WHERE t.id = (i.item->>'t')::uuid "
            f"AND t.labels @> ${first + len(args) - 1}::jsonb)"
        )
    return " AND ".join(parts) or "true", args


class TaskChangeStore:
    """Reads the change feed (it is written by the triggers of migration 0014, never here)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def now(self) -> Position:
        """The position of a reader starting now: nothing recorded so far is to come."""
        return Position.at(await self.pool.fetchval("SELECT pg_current_snapshot()::text"))

    async def purged_up_to(self) -> int:
        """The newest transaction whose changes retention deleted (a position from before it may miss some)."""
        return int(await self.pool.fetchval("SELECT up_to FROM task_changes_purged"))

    async def current(self, task_ids: Sequence[uuid.UUID], caller: str | None) -> tuple[list[Change], Position]:
        """Each of these tasks' current status (as a change: its last status entry), of `caller`'s tasks only
        (None: any), and the position right after them: what changes later is still to come."""
        rows = await self.pool.fetch(
            """
            SELECT pg_current_snapshot()::text AS snapshot, t.*
            FROM (SELECT 1) one
            LEFT JOIN LATERAL (
                SELECT 0::bigint AS id, k.id AS task_id, k.caller, k.device, jsonb_array_length(k.history) AS seq,
                       k.status, (k.history->-1->>'at')::timestamptz AS at,
                       COALESCE((k.history->-1->>'attempt')::integer, k.attempts) AS attempt,
                       COALESCE(k.history->-1->>'detail', '') AS detail,
                       (SELECT r.verdict FROM results r WHERE r.task_id = k.id AND k.status = 'SUCCEEDED') AS verdict
                FROM unnest($1::uuid[]) AS u(id)
                CROSS JOIN LATERAL (SELECT * FROM tasks WHERE tasks.id = u.id LIMIT 1) k
                WHERE $2::text IS NULL OR k.caller = $2
            ) t ON true
            """,
            list(task_ids),
            caller,
        )
        changes = [_current(r) for r in rows if r["task_id"] is not None]
        return changes, Position.at(rows[0]["snapshot"])

    async def read(self, scope: ChangeFilter, position: Position, limit: int) -> ChangePage:
        """The next changes after `position` (at most `limit`, in id order) and the position after them."""
        where, args = _where(scope, 5)
        # rows `seen` could not see: its running transactions' and later ones' (two index ranges of xid)
        unseen = (
            "(c.xid >= pg_snapshot_xmax($1::text::pg_snapshot)"
            " OR c.xid = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot))))"
        )
        rows = await self.pool.fetch(
            f"""
            SELECT s.snapshot, x.*
            FROM (SELECT pg_current_snapshot()::text AS snapshot) s
            LEFT JOIN LATERAL (
                SELECT c.id, i.k, i.item,
                       CASE WHEN i.item->'e' @> '[{{"status": "SUCCEEDED"}}]' THEN
                            (SELECT r.verdict FROM results r WHERE r.task_id = (i.item->>'t')::uuid LIMIT 1)
                       END AS verdict
                FROM (
                    SELECT c.id, c.items FROM task_changes c
                    WHERE {unseen} AND ($2::text IS NULL OR pg_visible_in_snapshot(c.xid, $2::text::pg_snapshot))
                      AND c.id >= $3
                    ORDER BY c.id
                    LIMIT $4
                ) c
                LEFT JOIN LATERAL (
                    SELECT i.k, i.item FROM jsonb_array_elements(c.items) WITH ORDINALITY AS i(item, k)
                    WHERE {where}
                ) i ON true
                ORDER BY c.id, i.k
            ) x ON true
            """,
            position.seen,
            None if position.between_reads else position.reading,
            position.from_id,
            limit,
            *args,
        )
        snapshot = rows[0]["snapshot"]
        found = [r for r in rows if r["id"] is not None]
        changes = [
            c
            for r in found
            if r["item"] is not None
            for c in _changes(r)
            if not (c.id == position.last_id and position.upto is not None and c.index <= position.upto)
        ]
        reading = snapshot if position.between_reads else position.reading
        if len({r["id"] for r in found}) >= limit:
            # cut short: the rest of what `reading` sees (rows after the last) comes next
            return ChangePage(changes, Position(position.seen, reading, found[-1]["id"]), reading, True)
        # complete: what `reading` sees is delivered; what it does not see comes next
        return ChangePage(changes, Position.at(reading), reading, False)


def _changes(row: asyncpg.Record) -> list[Change]:
    """The status changes of one task in a feed row (an entry keeping the status before it is a note)."""
    item = row["item"]
    out = []
    previous = item.get("p")
    base = (int(row["k"]) - 1) * ENTRY_SPAN
    for j, entry in enumerate(item.get("e") or ()):
        status = entry.get("status") if isinstance(entry, dict) else None
        if status != previous and isinstance(status, str):
            out.append(
                Change(
                    id=row["id"],
                    index=base + j,
                    task_id=uuid.UUID(item["t"]),
                    caller=item["c"],
                    device=item["d"],
                    seq=int(item["s"]) + j,
                    status=status,
                    at=_time(entry.get("at")),
                    attempt=int(entry.get("attempt") or 0),
                    detail=str(entry.get("detail") or ""),
                    verdict=row["verdict"] if status == "SUCCEEDED" else None,
                )
            )
        previous = status
    return out


def _current(row: asyncpg.Record) -> Change:
    return Change(
        id=0,
        index=0,
        task_id=row["task_id"],
        caller=row["caller"],
        device=row["device"],
        seq=row["seq"],
        status=row["status"],
        at=row["at"],
        attempt=row["attempt"],
        detail=row["detail"],
        verdict=row["verdict"],
    )


def _time(value: object) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    return datetime.fromtimestamp(0, UTC)
