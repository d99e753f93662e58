"""The SchedulerService RPCs: the workers' Pull streams, and GetWatermark.

A Pull stream opens with WorkerHello; then the worker sends credits, acks and nacks, and the
scheduler sends assignment batches. When the stream ends, whatever the worker still held goes back to
the front of its device's queue (the attempt counts: the worker may have died in the middle of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable

import grpc

from scheduler_svc.board import Board, Session
from scheduler_svc.dead_letters import DeadLetters, Filter, to_proto
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.watermark import Watermark
from sieve import rpc, telemetry
from sieve.auth import current_credential_valid, current_principal
from sieve.backoff import compute_backoff
from sieve.coalesce import coalesce
from sieve.errors import InvalidInput
from sieve.queue_store import QueueStore, now_ms
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc
from sieve.workers import KNOWN_TASK_TYPES, WorkerRecords, worker_id_problem

log = logging.getLogger("sieve.scheduler.pull")


def _append_batch(first: scheduler_pb2.PullResponse, later: scheduler_pb2.PullResponse) -> None:
    first.batch.assignments.extend(later.batch.assignments)


#: longest nack reason kept (the rest is cut); a task's history and dead letter hold it
MAX_REASON_CHARS = 500
#: most acks or nacks honoured in one message (a worker never holds more than its concurrency)
MAX_SETTLEMENTS = 10_000
#: how often an open stream's credential is checked again (a revoked one ends the stream)
CREDENTIAL_RECHECK_S = 1.0


def _hello_problem(hello: scheduler_pb2.WorkerHello, field: str = "hello") -> tuple[str, str] | None:
    """(field, description) of what is wrong with a WorkerHello, or None."""
    problem = worker_id_problem(hello.worker_id)
    if problem is not None:
        return f"{field}.worker_id", problem
    if len(hello.task_types) > len(KNOWN_TASK_TYPES):
        return f"{field}.task_types", f"has more than {len(KNOWN_TASK_TYPES)} entries"
    unknown = [t for t in hello.task_types if t not in KNOWN_TASK_TYPES]
    if unknown:
        return f"{field}.task_types", f"{unknown[0]} is not a known task type"
    return None


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    """The scheduler's RPCs. It owns the Pull streams' protocol: who may open one (a worker credential, as the
    worker id it names), how many tasks a stream may hold (the worker's registered concurrency), and which acks
    and nacks count (only for leases this stream holds, under their exact token; an ack for a task that
    PostgreSQL does not show finished puts it back instead of removing it)."""

    def __init__(self, queues: QueueStore, board: Board, outcomes: Outcomes, watermark: Watermark,
                 dead_letters: DeadLetters, records: WorkerRecords) -> None:
        self.queues = queues
        self.dead_letters = dead_letters
        self.board = board
        self.outcomes = outcomes
        self.watermark = watermark
        self.records = records
        self.fencing_refusals = 0
        #: acks refused because PostgreSQL did not show the task finished (the task was put back)
        self.unproven_acks = 0
        self._accepting = True
        #: credits of streams whose worker had not registered yet, kept (the worker does not send them again)
        #: until its record appears: the session -> (credits asked, the task looking for the record)
        self._unregistered: dict[Session, tuple[int, asyncio.Task[None]]] = {}

    def stop_accepting(self) -> None:
        self._accepting = False

    async def Pull(self, request_iterator: AsyncIterator[scheduler_pb2.PullRequest],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[scheduler_pb2.PullResponse]:
        if not self._accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler is shutting down; reconnect")
        principal = current_principal.get()
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello") or not first.hello.worker_id:
            await rpc.abort(context, rpc.invalid_argument("hello", "the first message must be a WorkerHello"))
        if not first.hello.task_types:
            await rpc.abort(context, rpc.invalid_argument("hello.task_types", "is empty"))
        problem = _hello_problem(first.hello)
        if problem is not None:
            await rpc.abort(context, rpc.invalid_argument(*problem))
        if not principal.may_act_as_worker(first.hello.worker_id):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"credential {principal.name!r} may not act as this worker id")
        session = self.board.open(first.hello)
        session.anonymous = principal.anonymous
        log.info("worker %s connected", session.worker_id, extra={"worker": session.worker_id})
        try:
            await self._handle(session, first)
        except Exception:
            await self.end_session(session, "worker stream closed")
            raise
        # acks and nacks are handled outside the stream's span (it lasts as long as the worker is connected)
        reader = asyncio.create_task(self._read(session, context), context=telemetry.detached_context())
        revoked = asyncio.Event()
        guard = asyncio.create_task(self._watch_credential(session, current_credential_valid.get(), revoked))
        try:
            while True:
                message = await session.outbound.get()
                if message is None or revoked.is_set():
                    break
                closing = coalesce(session.outbound, message, _append_batch)
                yield message
                if closing:
                    break
            if revoked.is_set():  # what it held goes back (finally); it gets nothing more
                log.warning("worker %s: credential revoked, stream ended", session.worker_id,
                            extra={"worker": session.worker_id})
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the credential of this stream was revoked")
        finally:
            for task in (reader, guard):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.end_session(session, "worker stream closed")

    @staticmethod
    async def _watch_credential(session: Session, valid: Callable[[], bool], revoked: asyncio.Event) -> None:
        """Ends the stream (within about a second) once its credential is revoked."""
        while not session.closed:
            await asyncio.sleep(CREDENTIAL_RECHECK_S)
            if not valid():
                revoked.set()
                session.outbound.put_nowait(None)
                return

    async def _read(self, session: Session, context: grpc.aio.ServicerContext) -> None:
        try:
            while True:
                request = await context.read()
                if request is grpc.aio.EOF:
                    break
                await self._handle(session, request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("worker %s stream broke: %s", session.worker_id, exc)
        finally:
            session.outbound.put_nowait(None)

    async def _credit_cap(self, session: Session) -> int:
        """The worker's registered concurrency; an anonymous worker (SIEVE_ALLOW_ANONYMOUS) that never
        registered gets the fleet maximum, an authenticated one nothing until it registers."""
        record = await self.records.get(session.worker_id)
        if record is not None and record.concurrency:
            return min(record.concurrency, self.queues.settings.max_worker_concurrency)
        return self.queues.settings.max_worker_concurrency if session.anonymous else 0

    async def _handle(self, session: Session, request: scheduler_pb2.PullRequest) -> None:
        session.last_seen = time.monotonic()
        if request.HasField("hello"):
            if request.hello.worker_id and request.hello.worker_id != session.worker_id:
                raise InvalidInput("hello.worker_id", "a stream keeps the worker id of its first hello")
            if _hello_problem(request.hello) is None and self.board.update(session, request.hello):
                log.info("worker %s now: gpu=%s, task types %s", session.worker_id, session.gpu,
                         sorted(session.task_types), extra={"worker": session.worker_id})
            session.credit_cap = await self._credit_cap(session)  # it may have registered again
        if request.acks:
            await self._ack(session, list(request.acks)[:MAX_SETTLEMENTS])
        if request.nacks:
            await self._nack(session, list(request.nacks)[:MAX_SETTLEMENTS])
        if request.draining:
            self.board.drop_credits(session)
            self._forget_unregistered(session)
        elif request.credits:
            if not session.credit_cap:  # not registered when the stream opened: look again
                session.credit_cap = await self._credit_cap(session)
            if session.credit_cap:
                self.board.add_credits(session, request.credits)
            else:
                self._await_registration(session, request.credits)

    def _await_registration(self, session: Session, credits: int) -> None:
        """Keeps the credits of a stream whose worker has not registered yet (its Register may land just after
        the stream opened) and grants them, up to its concurrency, once its record appears."""
        asked, waiter = self._unregistered.get(session, (0, None))
        if waiter is None:
            waiter = asyncio.create_task(self._grant_when_registered(session), context=telemetry.detached_context())
        self._unregistered[session] = (min(asked + credits, self.queues.settings.max_worker_concurrency), waiter)

    async def _grant_when_registered(self, session: Session) -> None:
        delay_s = 0.1
        while not session.closed:
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)
            try:
                session.credit_cap = await self._credit_cap(session)
            except Exception as exc:  # Redis away: look again later
                log.info("worker %s: registration not read: %s", session.worker_id, exc)
                continue
            if session.credit_cap:
                asked, _ = self._unregistered.pop(session, (0, None))
                self.board.add_credits(session, asked)
                return

    def _forget_unregistered(self, session: Session) -> None:
        _, waiter = self._unregistered.pop(session, (0, None))
        if waiter is not None and waiter is not asyncio.current_task():
            waiter.cancel()

    async def _ack(self, session: Session, acks: list[scheduler_pb2.Ack]) -> None:
        """Settles acks for leases this stream holds. A task PostgreSQL does not show finished (a worker that
        acks without storing a result) is put back with its attempt counted, not removed."""
        mine = [a for a in acks if self.board.holds(session, a.task_id, a.lease_token)]
        if len(mine) < len(acks):
            self.fencing_refusals += len(acks) - len(mine)
            log.info("%d acks refused: not a lease of this stream", len(acks) - len(mine),
                     extra={"worker": session.worker_id})
        if not mine:
            return
        try:
            unfinished = await self.outcomes.tasks.unfinished([uuid.UUID(a.task_id) for a in mine])
        except Exception as exc:  # cannot tell: put them back uncounted (a finished one is refused again)
            log.warning("acks of %d tasks not verified (%s): put back", len(mine), exc)
            await self._put_back(session, [(a, "ack not verified: PostgreSQL unavailable", False) for a in mine])
            return
        proven = [a for a in mine if uuid.UUID(a.task_id) not in unfinished]
        unproven = [a for a in mine if uuid.UUID(a.task_id) in unfinished]
        if proven:
            leased = [(a.task_id, session.held[a.task_id][1]) for a in proven]
            results = await self.queues.ack(leased)
            stale = results.count(False)
            if stale:
                self.fencing_refusals += stale
                log.info("%d acks refused: stale lease (the task was handed out again)", stale,
                         extra={"worker": session.worker_id})
            self.board.forget(session, [a.task_id for a in proven])
        if unproven:
            self.unproven_acks += len(unproven)
            log.warning("worker %s acked %d tasks without a stored result: put back", session.worker_id,
                        len(unproven), extra={"worker": session.worker_id})
            await self._put_back(session, [(a, "acked without a stored result", True) for a in unproven])

    async def _put_back(self, session: Session, items: list[tuple[scheduler_pb2.Ack, str, bool]]) -> None:
        await self._nack(session, [scheduler_pb2.Nack(task_id=a.task_id, lease_token=a.lease_token, reason=reason,
                                                      count_attempt=counts) for a, reason, counts in items])

    async def _nack(self, session: Session, nacks: list[scheduler_pb2.Nack]) -> None:
        """Nacked tasks go back after their retry delay: the worker's (capped), or for a counted failure the
        exponential retry backoff of its attempt; at max attempts they are dead-lettered. Only leases this
        stream holds, under their exact token, count."""
        Key = tuple[str, bool, float]
        by_key: dict[Key, list[tuple[str, int | None]]] = defaultdict(list)
        reasons: dict[Key, str] = {}
        now = now_ms()
        s = self.queues.settings
        for n in nacks:
            held = self.board.release(session, n.task_id) if self.board.holds(
                session, n.task_id, n.lease_token) else None
            if held is None:
                self.fencing_refusals += 1
                continue
            mac, attempt = held
            delay_s = n.retry_after.ToMilliseconds() / 1000 if n.HasField("retry_after") else 0.0
            delay_s = min(max(0.0, delay_s), s.defer_backoff_max_s)
            if n.count_attempt and not delay_s:
                delay_s = compute_backoff(attempt, base_s=s.retry_backoff_base_s, max_s=s.retry_backoff_max_s,
                                          jitter=False)
            key = (mac, n.count_attempt, round(now + delay_s * 1000, 1))
            by_key[key].append((n.task_id, attempt))
            reasons[key] = (n.reason or "nacked")[:MAX_REASON_CHARS]
        for (mac, counts, retry_at), leases in by_key.items():
            reason = reasons[(mac, counts, retry_at)]
            result = await self.queues.requeue(mac, leases, count_attempt=counts, reason=reason,
                                               retry_at_ms=retry_at, now=now)
            await self.outcomes.dead_lettered(result.dead_letters)

    async def end_session(self, session: Session, reason: str, *, count_attempt: bool = True) -> None:
        """Closes a session and puts back what it held."""
        self._forget_unregistered(session)
        if session.closed and not session.held:
            return
        held = self.board.close(session)
        for mac, leases in held.items():
            result = await self.queues.requeue(mac, list(leases), count_attempt=count_attempt, reason=reason)
            await self.outcomes.dead_lettered(result.dead_letters)
        if held:
            log.info("worker %s: %d held tasks put back (%s)", session.worker_id,
                     sum(len(v) for v in held.values()), reason, extra={"worker": session.worker_id})

    async def GetWatermark(self, request: scheduler_pb2.GetWatermarkRequest,
                           context: grpc.aio.ServicerContext) -> scheduler_pb2.GetWatermarkResponse:
        return await self.watermark.read()

    # --- dead letters ----------------------------------------------------------------------------
    async def _filter(self, f: scheduler_pb2.DeadLetterFilter, context: grpc.aio.ServicerContext,
                      *, everything: bool | None = None) -> Filter:
        """The request's filter; with `everything` given, an empty filter needs it to be true."""
        try:
            flt = Filter.from_proto(f)
            if everything is False and flt.empty:
                raise InvalidInput("all", "must be true to act on every dead letter with an empty filter")
            return flt
        except InvalidInput as exc:
            await rpc.abort(context, rpc.invalid_argument(exc.field, exc.description))
            raise

    async def ListDeadLetters(self, request: scheduler_pb2.ListDeadLettersRequest,
                              context: grpc.aio.ServicerContext) -> scheduler_pb2.ListDeadLettersResponse:
        records, total = await self.dead_letters.list(await self._filter(request.filter, context), request.limit)
        return scheduler_pb2.ListDeadLettersResponse(dead_letters=[to_proto(r) for r in records], total=total)

    async def RequeueDeadLetters(self, request: scheduler_pb2.RequeueDeadLettersRequest,
                                 context: grpc.aio.ServicerContext) -> scheduler_pb2.RequeueDeadLettersResponse:
        flt = await self._filter(request.filter, context, everything=request.all)
        return scheduler_pb2.RequeueDeadLettersResponse(task_ids=await self.dead_letters.requeue(flt))

    async def PurgeDeadLetters(self, request: scheduler_pb2.PurgeDeadLettersRequest,
                               context: grpc.aio.ServicerContext) -> scheduler_pb2.PurgeDeadLettersResponse:
        purged = await self.dead_letters.purge(await self._filter(request.filter, context, everything=request.all))
        return scheduler_pb2.PurgeDeadLettersResponse(purged=purged)

    async def ListAuditEvents(self, request: scheduler_pb2.ListAuditEventsRequest,
                              context: grpc.aio.ServicerContext) -> scheduler_pb2.ListAuditEventsResponse:
        from scheduler_svc.audit_rpc import list_audit_events  # the audit log, kept out of this module

        return await list_audit_events(request, context)
