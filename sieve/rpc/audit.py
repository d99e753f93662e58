"""The audit trail: who called which operator RPC, on what, from where, when, and how it ended.

`AuditInterceptor` (installed by `rpc.create_server` on every server, just before `auth.AuthInterceptor`)
records one `AuditEvent` for:

- **operator**: every call of an operator-only method (`auth.is_operator_only`) that reached its handler, after
  it ends, with its status (OK, INVALID_ARGUMENT, ...), the request as compact JSON (the filter, the ids), the
  caller's name and roles and `context.peer()`;
- **refused**: every attempt at an operator-only method that the auth interceptor refused (UNAUTHENTICATED,
  PERMISSION_DENIED), named by the credential presented when it is a valid one ('' otherwise), with what it
  asked for (its request, parsed when small). Anyone can make these, so they cost little and cannot fill the
  disk: written in the background, batched (one INSERT per batch), at most `REFUSAL_RATE_PER_S` a second per
  process (bursts of `REFUSAL_BURST`); beyond that they are counted, and once a second one row of method `*` and
  outcome `DROPPED` says how many were not recorded one by one (and a warning is logged);
- **cross_tenant**: an operator's call that read or changed another caller's data. The servicer says so with
  `cross_tenant(tenant, target)` while it serves the call (the intake's GetTask / CancelTask of a task whose
  caller is not the operator); one event per access is recorded when the call ends, with its status.

Operator and cross-tenant events are written before the call's answer goes out (an abort records them before
its status is sent: the handler gets a context whose `abort` does), within `WRITE_TIMEOUT_S`; a write that fails
or times out is logged (with the event) and never fails the RPC. Where the events go is an
`AuditSink`: `sieve.db.audit.AuditLog` (PostgreSQL, listed by SchedulerService.ListAuditEvents) on the intake
and the scheduler, `LogSink` (log lines of logger `sieve.rpc.audit`) on a server without PostgreSQL (the registry,
whose only operator RPC, ListWorkers, returns worker records and no tenant data).

Calls of clients and workers to their own methods pass through untouched (no wrapper, no cost).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

from sieve.db.audit import AuditEvent
from sieve.observe.rpc_metrics import Behavior, code_name, wrap_handler
from sieve.rpc.auth import (
    METHOD_ROLES,
    Authenticator,
    Principal,
    Role,
    bearer_of,
    current_peer,
    current_principal,
    is_operator_only,
)

log = logging.getLogger("sieve.rpc.audit")

#: an operator or cross-tenant event's write may hold the call's answer back this long at most
WRITE_TIMEOUT_S = 2.0
#: refused attempts waiting to be written; more are counted, not stored one by one
MAX_QUEUED_REFUSALS = 2000
#: refused attempts recorded one by one, per second and process, and the burst allowed above that rate
REFUSAL_RATE_PER_S = 20.0
REFUSAL_BURST = 200.0
#: how often a row sums up the refused attempts that were over the rate
DROPPED_SUMMARY_S = 1.0
#: refused attempts written per statement
REFUSAL_BATCH = 500
#: longest target (request JSON) and detail (status message) kept
MAX_TARGET_CHARS = 1000
MAX_DETAIL_CHARS = 500

#: the current principal before the auth interceptor decided (no roles; compared by identity)
_UNDECIDED = Principal("", frozenset())


class AuditSink(Protocol):
    """Where audit events go."""

    async def record(self, events: Sequence[AuditEvent]) -> None: ...


class LogSink:
    """Audit events as log lines (logger `sieve.rpc.audit`, the event's fields under `audit`), for servers without
    PostgreSQL."""

    async def record(self, events: Sequence[AuditEvent]) -> None:
        for event in events:
            fields = asdict(event)
            fields["at"] = event.at.isoformat()
            fields.pop("id")
            log.info(
                "audit %s %s by %r: %s",
                event.kind,
                event.method,
                event.principal,
                event.outcome,
                extra={"audit": fields},
            )


@dataclass(slots=True)
class CallScope:
    """The audited call being served (the servicer reaches it through `cross_tenant`)."""

    method: str
    principal: Principal
    peer: str
    sink: AuditSink
    #: (tenant, target) of each cross-tenant access of this call
    accesses: list[tuple[str, str]] = field(default_factory=list)


_scope: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("sieve_audit_scope", default=None)


def cross_tenant(tenant: str, target: str) -> None:
    """Notes that the call being served read or changed data of caller `tenant` (`target`, e.g. "task <id>")
    for an operator; recorded when the call ends. Outside an audited operator's call it does nothing."""
    scope = _scope.get()
    if scope is None:
        return
    if tenant != scope.principal.name:
        scope.accesses.append((tenant, target))


def current_sink() -> AuditSink | None:
    """The audit sink of the server serving the current operator call (None outside one)."""
    scope = _scope.get()
    return None if scope is None else scope.sink


def roles_of(principal: Principal) -> tuple[str, ...]:
    if principal.anonymous:
        return ("anonymous",)
    return tuple(sorted(r.value for r in principal.roles))


def describe_request(request: Any) -> str:
    """The request as compact JSON with sorted keys ('' for an empty or streamed request), truncated."""
    if not isinstance(request, Message):
        return ""
    try:
        fields = json_format.MessageToDict(request, preserving_proto_field_name=True)
    except Exception:  # never let describing a request break the call
        return type(request).__name__
    if not fields:
        return ""
    return json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))[:MAX_TARGET_CHARS]


#: a refused attempt's raw request is parsed for its target only up to this size
MAX_REFUSED_REQUEST_BYTES = 4096


def describe_raw_request(method: str, raw: Any) -> str:
    """The target of a refused attempt, whose handler got the request unparsed: parsed as the method's request
    type when it is small, else its size."""
    if not isinstance(raw, bytes):
        return describe_request(raw)
    if len(raw) > MAX_REFUSED_REQUEST_BYTES:
        return f"<{len(raw)} bytes>"
    try:
        service, _, name = method.lstrip("/").rpartition("/")
        pool = descriptor_pool.Default()  # type: ignore[no-untyped-call]  # types-protobuf leaves it unannotated
        method_desc = pool.FindServiceByName(service).methods_by_name[name]
        request = message_factory.GetMessageClass(method_desc.input_type).FromString(raw)
    except Exception:
        return f"<{len(raw)} bytes, not a request of {method}>"
    return describe_request(request)


def _peer(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    try:
        return str(context.peer() or "")
    except Exception:
        return ""


def _detail(context: grpc.aio.ServicerContext[Any, Any], outcome: str, error: BaseException | None) -> str:
    if outcome == "OK":
        return ""
    try:
        text = context.details()
    except Exception:
        text = None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if not text and error is not None and isinstance(error, Exception):
        text = type(error).__name__
    return (text or "")[:MAX_DETAIL_CHARS]


class _Call:
    """One audited call in flight: what it was, when it began; `events` says what to record at its end."""

    __slots__ = ("at", "began", "done", "kind", "scope", "target")

    def __init__(self, kind: str | None, scope: CallScope, request: Any) -> None:
        self.kind = kind
        self.scope = scope
        self.at = datetime.now(UTC)
        self.began = time.perf_counter()
        self.target = (
            ""
            if not kind
            else describe_raw_request(scope.method, request)
            if kind == "refused"
            else describe_request(request)
        )
        #: recorded already (at an abort, before its status went out)
        self.done = False

    def events(self, outcome: str, detail: str) -> list[AuditEvent]:
        s = self.scope
        common: dict[str, Any] = dict(
            principal=s.principal.name,
            roles=roles_of(s.principal),
            method=s.method,
            outcome=outcome,
            at=self.at,
            peer=s.peer,
            detail=detail,
            duration_ms=round((time.perf_counter() - self.began) * 1000, 3),
        )
        events = [AuditEvent(kind=self.kind, target=self.target, **common)] if self.kind else []
        events += [
            AuditEvent(kind="cross_tenant", target=target, tenant=tenant, **common) for tenant, target in s.accesses
        ]
        return events


class _AuditedContext:
    """The servicer context an audited handler gets: `abort` / `abort_with_status` record the call's events
    before the status goes out (grpc sends it at once), so that the caller learns the outcome only after the
    record is stored; everything else is the real context's."""

    __slots__ = ("_context", "_on_abort")

    def __init__(
        self, context: grpc.aio.ServicerContext[Any, Any], on_abort: Callable[[str, str], Awaitable[None]]
    ) -> None:
        self._context = context
        self._on_abort = on_abort

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        await self._on_abort(code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN", details or "")
        await self._context.abort(code, details, trailing_metadata)

    async def abort_with_status(self, status: grpc.Status) -> None:
        code = getattr(status, "code", None)
        await self._on_abort(
            code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN", str(getattr(status, "details", "") or "")
        )
        await self._context.abort_with_status(status)


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class AuditInterceptor(grpc.aio.ServerInterceptor):
    """Records operator calls, refused attempts at them and operators' cross-tenant accesses into a sink.

    Must run just before `auth.AuthInterceptor` (it tells a refused call by the principal that interceptor did
    not set); `authenticator` names the caller of a refused call from the credential it presented.
    """

    def __init__(self, sink: AuditSink, authenticator: Authenticator | None = None) -> None:
        self.sink = sink
        self.authenticator = authenticator
        self._refusals: list[AuditEvent] = []
        self._writer: asyncio.Task[None] | None = None
        #: refused attempts not stored one by one (over the rate, or the queue full) since the last summary row
        self.dropped_refusals = 0
        self._tokens = REFUSAL_BURST
        self._refilled = time.monotonic()
        self._summary_due = False
        #: events whose write failed (since start)
        self.failed_writes = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, _Resp] | None:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        current_principal.set(_UNDECIDED)
        handler = await continuation(details)
        if handler is None or method not in METHOD_ROLES:
            return handler
        principal = current_principal.get()
        operator_only = is_operator_only(method)
        if principal is _UNDECIDED:  # the auth interceptor refused the call
            if not operator_only:
                return handler
            caller = self._refused_caller(details)
            return wrap_handler(handler, lambda b, s: self._wrap(b, s, "refused", method, caller))
        if operator_only:
            return wrap_handler(handler, lambda b, s: self._wrap(b, s, "operator", method, principal))
        if principal.is_operator and Role.CLIENT in METHOD_ROLES[method]:
            # an operator calling a client method may touch other callers' data: listen for cross_tenant()
            return wrap_handler(handler, lambda b, s: self._wrap(b, s, None, method, principal))
        return handler

    def _refused_caller(self, details: grpc.HandlerCallDetails) -> Principal:
        token = bearer_of(details.invocation_metadata)
        found = self.authenticator.principal(token) if token and self.authenticator is not None else None
        return found or _UNDECIDED

    def _wrap(
        self, behavior: Behavior, streaming: bool, kind: str | None, method: str, principal: Principal
    ) -> Behavior:
        def begin(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[_Call, _AuditedContext]:
            peer = _peer(context)
            current_peer.set(peer)
            scope = CallScope(method, principal, peer, self.sink)
            _scope.set(scope)
            call = _Call(kind, scope, request)

            async def on_abort(outcome: str, detail: str) -> None:
                await self._record(call, call.events(outcome, detail[:MAX_DETAIL_CHARS]), cancelled=False)

            return call, _AuditedContext(context, on_abort)

        if streaming and inspect.isasyncgenfunction(behavior):

            async def streamed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                (call, audited), error = begin(request, context), None
                try:
                    async for response in behavior(request, audited):
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    await self._finish(call, context, error)

            return streamed

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            (call, audited), error = begin(request, context), None
            try:
                return await behavior(request, audited)
            except BaseException as exc:
                error = exc
                raise
            finally:
                await self._finish(call, context, error)

        return unary

    async def _finish(
        self, call: _Call, context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None
    ) -> None:
        if call.done:
            return
        outcome = code_name(context, error)
        cancelled = error is not None and not isinstance(error, Exception)
        await self._record(call, call.events(outcome, _detail(context, outcome, error)), cancelled=cancelled)

    async def _record(self, call: _Call, events: list[AuditEvent], *, cancelled: bool) -> None:
        call.done = True
        if not events:
            return
        if call.kind == "refused":
            self._queue_refusals(events)
        elif cancelled:  # the call's task is being cancelled: write without waiting
            task = asyncio.get_running_loop().create_task(self.write(events))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
        else:
            await self.write(events)

    async def write(self, events: Sequence[AuditEvent]) -> bool:
        """Stores events in the sink within WRITE_TIMEOUT_S; a failure is logged with the events, never raised."""
        try:
            await asyncio.wait_for(self.sink.record(events), timeout=WRITE_TIMEOUT_S)
            return True
        except Exception as exc:
            self.failed_writes += len(events)
            log.warning(
                "audit write failed (%s: %s); events not stored: %s",
                type(exc).__name__,
                exc,
                [asdict(e) | {"at": e.at.isoformat()} for e in events][:20],
            )
            return False

    # --- refused attempts: bounded queue, one writer, batched -------------------------------------------
    def _queue_refusals(self, events: Sequence[AuditEvent]) -> None:
        now = time.monotonic()
        self._tokens = min(REFUSAL_BURST, self._tokens + (now - self._refilled) * REFUSAL_RATE_PER_S)
        self._refilled = now
        loop = asyncio.get_running_loop()
        for event in events:
            if self._tokens >= 1 and len(self._refusals) < MAX_QUEUED_REFUSALS:
                self._tokens -= 1
                self._refusals.append(event)
            else:
                self.dropped_refusals += 1
                if not self._summary_due:
                    self._summary_due = True
                    loop.call_later(DROPPED_SUMMARY_S, self._summarize_dropped)
        self._start_writer()

    def _start_writer(self) -> None:
        if self._refusals and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write_refusals())

    def _summarize_dropped(self) -> None:
        """One row for the refused attempts over the rate since the last one (and a warning)."""
        self._summary_due = False
        dropped, self.dropped_refusals = self.dropped_refusals, 0
        if not dropped:
            return
        log.warning(
            "%d refused attempts at operator RPCs were not recorded one by one (over %.0f/s)",
            dropped,
            REFUSAL_RATE_PER_S,
        )
        self._refusals.append(
            AuditEvent(
                kind="refused",
                principal="",
                roles=(),
                method="*",
                outcome="DROPPED",
                target=f"{dropped} attempts",
                detail=f"{dropped} refused attempts at operator RPCs in the last {DROPPED_SUMMARY_S:.0f} s were not "
                f"recorded one by one (more than {REFUSAL_RATE_PER_S:.0f}/s)",
            )
        )
        self._start_writer()

    async def _write_refusals(self) -> None:
        while self._refusals:
            batch, self._refusals = self._refusals[:REFUSAL_BATCH], self._refusals[REFUSAL_BATCH:]
            await self.write(batch)

    async def flush(self) -> None:
        """Waits until the refused attempts queued so far are written (tests, shutdown)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)


_BACKGROUND: set[asyncio.Task[Any]] = set()

__all__ = [
    "AuditInterceptor",
    "AuditSink",
    "CallScope",
    "LogSink",
    "cross_tenant",
    "current_sink",
    "describe_request",
    "roles_of",
]
