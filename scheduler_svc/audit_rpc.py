"""SchedulerService.ListAuditEvents: the audit log (sieve/db/audit.py), newest first, for operators.

The log listed is the one this server's AuditInterceptor writes to (`sieve.rpc.audit.current_sink`: the scheduler's
PostgreSQL `AuditLog`), so a listing shows exactly what was recorded in this schema — the intake's and the
scheduler's events alike. ListAuditEvents is operator-only (and itself audited).
Bad input is INVALID_ARGUMENT naming the field: limit over 1000, an unknown kind, a page token this
server did not hand out, a `before` timestamp out of range.
"""

from __future__ import annotations

import logging
from datetime import UTC
from typing import Any

import asyncpg
import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from sieve import rpc
from sieve.db.audit import MAX_LIMIT, AuditEvent, AuditLog, AuditQuery, BadPageToken
from sieve.fields import text_problem
from sieve.rpc.audit import current_sink
from sieve.v1 import scheduler_pb2

log = logging.getLogger("sieve.scheduler.audit")

_KIND_NAMES = {
    scheduler_pb2.AUDIT_KIND_OPERATOR: "operator",
    scheduler_pb2.AUDIT_KIND_REFUSED: "refused",
    scheduler_pb2.AUDIT_KIND_CROSS_TENANT: "cross_tenant",
}
_KIND_VALUES = {name: value for value, name in _KIND_NAMES.items()}
_MAX_FILTER_CHARS = 256


def to_proto(event: AuditEvent) -> scheduler_pb2.AuditEvent:
    at = timestamp_pb2.Timestamp()
    at.FromDatetime(event.at)
    duration = duration_pb2.Duration()
    duration.FromMicroseconds(int(event.duration_ms * 1000))
    return scheduler_pb2.AuditEvent(
        id=event.id,
        at=at,
        kind=_KIND_VALUES.get(event.kind, scheduler_pb2.AUDIT_KIND_UNSPECIFIED),
        principal=event.principal,
        roles=list(event.roles),
        method=event.method,
        target=event.target,
        tenant=event.tenant or "",
        peer=event.peer,
        outcome=event.outcome,
        detail=event.detail,
        duration=duration,
    )


async def _invalid(context: grpc.aio.ServicerContext[Any, Any], field: str, description: str) -> None:
    await rpc.abort(context, rpc.invalid_argument(field, description))


async def list_audit_events(
    request: scheduler_pb2.ListAuditEventsRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> scheduler_pb2.ListAuditEventsResponse:
    """Validates the request, reads one page of the audit log, answers it with the next page's token."""
    if request.limit > MAX_LIMIT:
        await _invalid(context, "limit", f"must be at most {MAX_LIMIT}")
    if request.kind and request.kind not in _KIND_NAMES:
        await _invalid(context, "kind", f"unknown kind {request.kind}")
    for name in ("principal", "method", "outcome", "page_token"):
        problem = text_problem(getattr(request, name), max_chars=_MAX_FILTER_CHARS)  # length, and no U+0000
        if problem is not None:
            await _invalid(context, name, problem)
    before = None
    if request.HasField("before"):
        try:
            before = request.before.ToDatetime(tzinfo=UTC)
        except (ValueError, OverflowError):
            await _invalid(context, "before", "is not a valid time")
    sink = current_sink()
    if not isinstance(sink, AuditLog):
        await rpc.abort(
            context,
            rpc.plain_status(grpc.StatusCode.FAILED_PRECONDITION, "this server keeps no audit log in PostgreSQL"),
        )
    assert isinstance(sink, AuditLog)
    query = AuditQuery(
        limit=request.limit,
        principal=request.principal,
        method=request.method,
        kind=_KIND_NAMES.get(request.kind, ""),
        outcome=request.outcome.upper(),
        before=before,
        page_token=request.page_token,
    )
    try:
        events, token = await sink.list(query)
    except BadPageToken:
        await _invalid(context, "page_token", "is not a token this server handed out")
        raise
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
        log.warning("audit log unavailable: %s", exc)
        await rpc.abort(context, rpc.plain_status(grpc.StatusCode.UNAVAILABLE, "audit log unavailable, retry"))
        raise
    return scheduler_pb2.ListAuditEventsResponse(events=[to_proto(e) for e in events], next_page_token=token)


__all__ = ["list_audit_events", "to_proto"]
