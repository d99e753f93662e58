"""The audit_events table (migration 0007): every SQL statement that writes or lists the audit log lives here.

Rows are only ever inserted (service roles hold INSERT, the scheduler also SELECT; nothing updates or deletes
them). Listing is newest first, `(at, id)` descending, paged by keyset: a page token is the `(at, id)` of the
last event of the previous page, so pages stay stable while new events arrive.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg

KINDS = ("operator", "refused", "cross_tenant")
#: most events one list call returns
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - _EPOCH


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audited call: who (principal, roles), what (method, target, tenant), when, from where, outcome."""

    kind: str
    principal: str
    roles: tuple[str, ...]
    method: str
    outcome: str
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    target: str = ""
    tenant: str | None = None
    peer: str = ""
    detail: str = ""
    duration_ms: float = 0.0
    #: assigned by the database (0 until stored)
    id: int = 0


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which events to list: all filters optional (empty matches everything)."""

    limit: int = DEFAULT_LIMIT
    principal: str = ""
    #: a full method name ("/sieve.v1.SchedulerService/PurgeDeadLetters") or just its last part ("PurgeDeadLetters")
    method: str = ""
    kind: str = ""
    outcome: str = ""
    #: only events that began before this time
    before: datetime | None = None
    #: continue after the event this token names (the `next_page_token` of the previous page)
    page_token: str = ""


class BadPageToken(ValueError):
    """A page token that this store did not hand out."""


def encode_page_token(at: datetime, event_id: int) -> str:
    micros = (at - _EPOCH) // _MICRO
    return base64.urlsafe_b64encode(f"{micros}:{event_id}".encode()).decode().rstrip("=")


def decode_page_token(token: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
        micros_text, _, id_text = raw.partition(":")
        micros, event_id = int(micros_text), int(id_text)
        return _EPOCH + micros * _MICRO, event_id
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError):
        raise BadPageToken(token[:40]) from None


class AuditLog:
    """Writes audit events and lists them, through one asyncpg pool on the service's schema."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def record(self, events: Sequence[AuditEvent]) -> None:
        """Stores events in one statement."""
        if not events:
            return
        await self.pool.execute(
            """
            INSERT INTO audit_events (at, kind, principal, roles, method, target, tenant, peer, outcome, detail,
                                      duration_ms)
            SELECT u.at, u.kind, u.principal, string_to_array(u.roles, ','), u.method, u.target, u.tenant, u.peer,
                   u.outcome, u.detail, u.duration_ms
            FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                        $8::text[], $9::text[], $10::text[], $11::real[])
                 AS u(at, kind, principal, roles, method, target, tenant, peer, outcome, detail, duration_ms)
            """,
            [e.at for e in events],
            [e.kind for e in events],
            [e.principal for e in events],
            [",".join(e.roles) for e in events],
            [e.method for e in events],
            [e.target for e in events],
            [e.tenant for e in events],
            [e.peer for e in events],
            [e.outcome for e in events],
            [e.detail for e in events],
            [e.duration_ms for e in events],
        )

    async def list(self, query: AuditQuery) -> tuple[list[AuditEvent], str]:
        """Events matching `query`, newest first, and the token of the next page ('' when this is the last)."""
        limit = max(1, min(query.limit or DEFAULT_LIMIT, MAX_LIMIT))
        after_at: datetime | None = None
        after_id: int | None = None
        if query.page_token:
            after_at, after_id = decode_page_token(query.page_token)
        method_exact, method_short = (query.method, None) if "/" in query.method else (None, query.method or None)
        rows = await self.pool.fetch(
            """
            SELECT id, at, kind, principal, roles, method, target, tenant, peer, outcome, detail, duration_ms
            FROM audit_events
            WHERE ($1::text IS NULL OR principal = $1)
              AND ($2::text IS NULL OR method = $2)
              AND ($3::text IS NULL OR method LIKE '%/' || $3)
              AND ($4::text IS NULL OR kind = $4)
              AND ($5::text IS NULL OR outcome = $5)
              AND ($6::timestamptz IS NULL OR at < $6)
              AND ($7::timestamptz IS NULL OR (at, id) < ($7, $8::bigint))
            ORDER BY at DESC, id DESC
            LIMIT $9
            """,
            query.principal or None,
            method_exact,
            _like_escape(method_short),
            query.kind or None,
            query.outcome or None,
            query.before,
            after_at,
            after_id,
            limit + 1,
        )
        events = [
            AuditEvent(
                kind=r["kind"],
                principal=r["principal"],
                roles=tuple(r["roles"]),
                method=r["method"],
                outcome=r["outcome"],
                at=r["at"],
                target=r["target"],
                tenant=r["tenant"],
                peer=r["peer"],
                detail=r["detail"],
                duration_ms=r["duration_ms"],
                id=r["id"],
            )
            for r in rows[:limit]
        ]
        token = encode_page_token(events[-1].at, events[-1].id) if len(rows) > limit else ""
        return events, token


def _like_escape(text: str | None) -> str | None:
    if text is None:
        return None
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


__all__ = [
    "DEFAULT_LIMIT",
    "KINDS",
    "MAX_LIMIT",
    "AuditEvent",
    "AuditLog",
    "AuditQuery",
    "BadPageToken",
    "decode_page_token",
    "encode_page_token",
]
