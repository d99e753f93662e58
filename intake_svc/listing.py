"""ListTasks for the intake: a `ListTasksRequest` checked and turned into a `TaskQuery` scoped to its caller (a
client lists its own tasks; an operator every caller's, or one's), the page token, and the reply.

A page token is opaque to the caller: the last id the page reached and a digest of the request's filters and
scope, so that a token is only good for the query it came from (another query's, or a made-up one, is
INVALID_ARGUMENT naming `page_token`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from datetime import datetime

import asyncpg
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from intake_svc.task_view import task_message
from intake_svc.validation import checked_labels, parse_device, parse_time
from sieve.db.task_listing import TaskPage, TaskQuery, list_tasks
from sieve.enums import enum_name
from sieve.errors import InvalidInput
from sieve.fields import shown, text_problem
from sieve.rpc import audit
from sieve.rpc.auth import Principal
from sieve.v1 import intake_pb2, types_pb2

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_CALLER = 200
_TOKEN_PREFIX = b"lt1"


class NotPermitted(Exception):
    """A client asked for another caller's tasks."""


def query_of(request: intake_pb2.ListTasksRequest, principal: Principal) -> TaskQuery:
    """The request's filters, scoped to what `principal` may see; InvalidInput naming a bad field, NotPermitted
    for a client naming another caller."""
    after = _time(request, "created_after")
    before = _time(request, "created_before")
    if after is not None and before is not None and after >= before:
        raise InvalidInput("created_before", "must be later than created_after")
    return TaskQuery(
        caller_scope(request.caller, principal, "list the tasks of"),
        _device(request),
        _statuses(request),
        _enum_filter(request.type, types_pb2.TaskType, "type"),
        _enum_filter(request.verdict, types_pb2.Verdict, "verdict"),
        checked_labels(request.labels, "labels") or {},
        after,
        before,
    )


def caller_scope(caller: str, principal: Principal, what: str) -> str | None:
    """Whose records a request may read (`caller` as it names one, `what` saying what for a refusal): a client's own;
    an operator's choice (None: every caller's). InvalidInput naming `caller`, NotPermitted for a client naming
    another caller. ListTasks, WatchTask and GetStats scope themselves with it."""
    if not caller:
        return None if principal.is_operator else principal.name
    problem = text_problem(caller, max_chars=MAX_CALLER, printable=True)
    if problem is not None:
        raise InvalidInput("caller", problem)
    if caller != principal.name and not principal.is_operator:
        raise NotPermitted(f"only operators may {what} another caller ({shown(caller)})")
    return caller


def _device(request: intake_pb2.ListTasksRequest) -> str | None:
    return parse_device(request.device_id) if request.device_id else None


def _statuses(request: intake_pb2.ListTasksRequest) -> tuple[str, ...]:
    statuses = []
    for i, status in enumerate(request.statuses):
        if status == types_pb2.TASK_STATUS_UNSPECIFIED or status not in types_pb2.TaskStatus.values():
            raise InvalidInput(f"statuses[{i}]", f"unknown status {status}")
        statuses.append(enum_name(types_pb2.TaskStatus, status))
    return tuple(statuses)


def _enum_filter(value: int, enum: EnumTypeWrapper, field: str) -> str | None:
    """The name of an enum filter's value (None: unset), or InvalidInput naming `field`."""
    if not value:
        return None
    if value not in enum.values():
        raise InvalidInput(field, f"unknown {field} {value}")
    return enum_name(enum, value)


def _time(request: intake_pb2.ListTasksRequest, name: str) -> datetime | None:
    return parse_time(getattr(request, name), name) if request.HasField(name) else None


def page_size_of(request: intake_pb2.ListTasksRequest) -> int:
    if request.page_size > MAX_PAGE_SIZE:
        raise InvalidInput("page_size", f"must be at most {MAX_PAGE_SIZE}")
    return request.page_size or DEFAULT_PAGE_SIZE


def _digest(query: TaskQuery) -> bytes:
    """What a token is bound to: the query's scope and filters."""
    text = repr(
        (
            query.caller,
            query.device,
            sorted(query.statuses),
            query.task_type,
            query.verdict,
            sorted(query.labels.items()),
            query.created_after and query.created_after.isoformat(),
            query.created_before and query.created_before.isoformat(),
        )
    )
    return hashlib.sha256(text.encode()).digest()[:12]


def encode_token(query: TaskQuery, below: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(_TOKEN_PREFIX + below.bytes + _digest(query)).decode().rstrip("=")


def decode_token(token: str, query: TaskQuery) -> uuid.UUID | None:
    """The id a token says to go on below (None: no token); InvalidInput for a token of another query or none."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token[:64] + "=" * (-len(token[:64]) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(token) > 64 or len(raw) != 31 or not raw.startswith(_TOKEN_PREFIX) or raw[19:] != _digest(query):
        raise InvalidInput("page_token", "is not a page token of this query (send the same filters)")
    return uuid.UUID(bytes=raw[3:19])


def reply_of(page: TaskPage, query: TaskQuery) -> intake_pb2.ListTasksResponse:
    # the rows carry an empty history (sieve/db/task_listing.py: COLUMNS), so no history and no attempt log
    tasks = [task_message(row, page.results.get(row["id"])) for row in page.rows]
    token = encode_token(query, page.next_below) if page.next_below is not None else ""
    return intake_pb2.ListTasksResponse(tasks=tasks, next_page_token=token)


async def list_page(
    pool: asyncpg.Pool, request: intake_pb2.ListTasksRequest, principal: Principal
) -> intake_pb2.ListTasksResponse:
    """One page of ListTasks for `principal`."""
    query = query_of(request, principal)
    size = page_size_of(request)
    below = decode_token(request.page_token, query)
    if query.caller != principal.name:  # an operator reading other callers' tasks
        audit.cross_tenant(query.caller or "*", "task list")
    return reply_of(await list_tasks(pool, query, size, below), query)
