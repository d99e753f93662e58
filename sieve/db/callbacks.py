"""The outbox of completion callbacks (migration 0014 `callback_deliveries`): every SQL statement about a
delivery lives here. A trigger adds a row when a task with a callback_url becomes final; the notifier
(scheduler_svc/callbacks.py) claims due rows (reading what a body needs of its task with them), fixes each one's
body at its first attempt, and records how each attempt ended; GetTask reads a task's rows.

A claim moves `next_at` ahead by the lease: a replica that dies while sending leaves the row due again when the
lease runs out, so a delivery is tried until it is DELIVERED or GAVE_UP — at least once, never lost.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

FINAL_STATES = ("DELIVERED", "GAVE_UP")


@dataclass(frozen=True, slots=True)
class DueDelivery:
    """A delivery claimed for one attempt."""

    task_id: uuid.UUID
    seq: int
    caller: str
    url: str
    status: str
    #: attempts made, this one included
    attempts: int
    created_at: datetime
    #: the JSON sent (None until the first attempt fixes it)
    body: bytes | None
    #: what a body is made of (its task and result's columns), read with the claim while it has none
    subject: asyncpg.Record | None = None

    @property
    def delivery_id(self) -> str:
        return f"{self.task_id}/{self.seq}"


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """How one attempt ended: DELIVERED, GAVE_UP, or PENDING again at `next_at`."""

    task_id: uuid.UUID
    seq: int
    state: str
    http_status: int | None
    error: str | None
    next_at: datetime | None = None


class CallbackStore:
    """Reads and writes callback deliveries through one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def of_task(self, task_id: uuid.UUID) -> list[asyncpg.Record]:
        """A task's deliveries, oldest first (one per time it became final)."""
        return await self.pool.fetch("SELECT * FROM callback_deliveries WHERE task_id = $1 ORDER BY seq", task_id)

    async def claim(self, limit: int, lease_s: float) -> list[DueDelivery]:
        """Up to `limit` due deliveries, oldest due first, none another replica holds; each is leased for
        `lease_s` (due again then, should this attempt never be recorded) and its attempt counted."""
        rows = await self.pool.fetch(
            """
            UPDATE callback_deliveries d
            SET next_at = now() + make_interval(secs => $2), attempts = d.attempts + 1
            FROM (SELECT task_id, seq, body IS NULL AS fresh FROM callback_deliveries
                  WHERE state = 'PENDING' AND next_at <= now()
                  ORDER BY next_at
                  LIMIT $1
                  FOR UPDATE SKIP LOCKED) c
            LEFT JOIN LATERAL (
                SELECT t.device, t.caller AS task_caller, t.type, t.attempts AS task_attempts, t.labels, t.error,
                       t.created_at AS task_created_at, t.updated_at, t.history
                FROM tasks t WHERE c.fresh AND t.id = c.task_id LIMIT 1
            ) t ON true
            LEFT JOIN LATERAL (
                SELECT r.verdict, r.hits FROM results r WHERE c.fresh AND r.task_id = c.task_id LIMIT 1
            ) r ON true
            WHERE d.task_id = c.task_id AND d.seq = c.seq
            RETURNING d.task_id, d.seq, d.caller, d.url, d.status, d.attempts, d.created_at, d.body,
                      t.history IS NOT NULL AS found, t.device, t.task_caller, t.type, t.task_attempts, t.labels,
                      t.error, t.task_created_at, t.updated_at, t.history, r.verdict, r.hits
            """,
            limit,
            lease_s,
        )
        return [
            DueDelivery(
                r["task_id"],
                r["seq"],
                r["caller"],
                r["url"],
                r["status"],
                r["attempts"],
                r["created_at"],
                r["body"],
                r if r["found"] else None,
            )
            for r in rows
        ]

    async def next_due_in_s(self) -> float | None:
        """Seconds until the next pending delivery is due (0 when one is due now); None when none is pending."""
        # (not greatest(0, ...) in SQL: greatest skips a NULL, and an empty outbox would read as one due now)
        value = await self.pool.fetchval(
            "SELECT extract(epoch FROM min(next_at) - now())::float8 FROM callback_deliveries WHERE state = 'PENDING'"
        )
        return None if value is None else max(0.0, float(value))

    async def fix_bodies(self, bodies: Sequence[tuple[uuid.UUID, int, bytes]]) -> dict[tuple[uuid.UUID, int], bytes]:
        """Stores each delivery's body unless one is stored already; returns the body each now has (every
        attempt sends the same bytes, whichever replica made them first)."""
        rows = await self.pool.fetch(
            """
            UPDATE callback_deliveries d SET body = COALESCE(d.body, u.body)
            FROM unnest($1::uuid[], $2::int[], $3::bytea[]) AS u(task_id, seq, body)
            WHERE d.task_id = u.task_id AND d.seq = u.seq
            RETURNING d.task_id, d.seq, d.body
            """,
            [b[0] for b in bodies],
            [b[1] for b in bodies],
            [b[2] for b in bodies],
        )
        return {(r["task_id"], r["seq"]): bytes(r["body"]) for r in rows}

    async def record(self, outcomes: Sequence[AttemptOutcome]) -> None:
        """Records how attempts ended (a delivery already DELIVERED or GAVE_UP is left as it is)."""
        await self.pool.execute(
            """
            UPDATE callback_deliveries d
            SET state = u.state, last_http_status = u.http_status, last_error = u.error,
                next_at = COALESCE(u.next_at, d.next_at),
                delivered_at = CASE WHEN u.state = 'DELIVERED' THEN now() ELSE d.delivered_at END
            FROM unnest($1::uuid[], $2::int[], $3::text[], $4::int[], $5::text[], $6::timestamptz[])
                 AS u(task_id, seq, state, http_status, error, next_at)
            WHERE d.task_id = u.task_id AND d.seq = u.seq AND d.state = 'PENDING'
            """,
            [o.task_id for o in outcomes],
            [o.seq for o in outcomes],
            [o.state for o in outcomes],
            [o.http_status for o in outcomes],
            [o.error for o in outcomes],
            [o.next_at for o in outcomes],
        )


def body_of(delivery: DueDelivery) -> bytes:
    """The JSON a delivery POSTs: the task's final state as of when it became final (README "Callbacks"), from
    what the claim read of it (`DueDelivery.subject`; a task gone meanwhile leaves only the delivery's own)."""
    task = delivery.subject
    payload: dict[str, Any] = {
        "delivery_id": delivery.delivery_id,
        "task_id": str(delivery.task_id),
        "status": delivery.status,
    }
    if task is not None:
        history = task["history"] or []
        final = history[delivery.seq - 1] if 0 < delivery.seq <= len(history) else {}
        payload.update(
            device_id=task["device"],
            caller=task["task_caller"],
            type=task["type"],
            attempt=final.get("attempt", task["task_attempts"]),
            labels=task["labels"] or {},
            error=(task["error"] or None) if delivery.status != "SUCCEEDED" else None,
            created_at=task["task_created_at"].isoformat(),
            finished_at=final.get("at") or task["updated_at"].isoformat(),
        )
        if delivery.status == "SUCCEEDED" and task["verdict"] is not None:
            payload["verdict"] = task["verdict"]
            payload["hits"] = [
                {
                    k: h[k]
                    for k in ("word", "category", "severity", "start", "end", "matched_text", "line", "rules")
                    if k in h
                }
                for h in task["hits"] or []
            ]
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
