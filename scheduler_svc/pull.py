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
from collections import defaultdict
from collections.abc import AsyncIterator

import grpc

from scheduler_svc.board import Board, Session
from scheduler_svc.dead_letters import DeadLetters, Filter, to_proto
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.watermark import Watermark
from sieve import rpc, telemetry
from sieve.backoff import compute_backoff
from sieve.coalesce import coalesce
from sieve.errors import InvalidInput
from sieve.queue_store import QueueStore, now_ms
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("sieve.scheduler.pull")


def _append_batch(first: scheduler_pb2.PullResponse, later: scheduler_pb2.PullResponse) -> None:
    first.batch.assignments.extend(later.batch.assignments)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, queues: QueueStore, board: Board, outcomes: Outcomes, watermark: Watermark,
                 dead_letters: DeadLetters) -> None:
        self.queues = queues
        self.dead_letters = dead_letters
        self.board = board
        self.outcomes = outcomes
        self.watermark = watermark
        self.fencing_refusals = 0
        self._accepting = True

    def stop_accepting(self) -> None:
        self._accepting = False

    async def Pull(self, request_iterator: AsyncIterator[scheduler_pb2.PullRequest],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[scheduler_pb2.PullResponse]:
        if not self._accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler is shutting down; reconnect")
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello") or not first.hello.worker_id:
            await rpc.abort(context, rpc.invalid_argument("hello", "the first message must be a WorkerHello"))
        if not first.hello.task_types:
            await rpc.abort(context, rpc.invalid_argument("hello.task_types", "is empty"))
        session = self.board.open(first.hello)
        log.info("worker %s connected", session.worker_id, extra={"worker": session.worker_id})
        await self._handle(session, first)
        # acks and nacks are handled outside the stream's span (it lasts as long as the worker is connected)
        reader = asyncio.create_task(self._read(session, context), context=telemetry.detached_context())
        try:
            while True:
                message = await session.outbound.get()
                if message is None:
                    break
                closing = coalesce(session.outbound, message, _append_batch)
                yield message
                if closing:
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await self.end_session(session, "worker stream closed")

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

    async def _handle(self, session: Session, request: scheduler_pb2.PullRequest) -> None:
        session.last_seen = time.monotonic()
        if request.HasField("hello") and self.board.update(session, request.hello):
            log.info("worker %s now: gpu=%s, task types %s", session.worker_id, session.gpu,
                     sorted(session.task_types), extra={"worker": session.worker_id})
        if request.acks:
            pairs = [(a.task_id, int(a.lease_token or 0)) for a in request.acks]
            results = await self.queues.ack(pairs)
            stale = results.count(False)
            if stale:
                self.fencing_refusals += stale
                log.info("%d acks refused: stale lease (the task was handed out again)", stale,
                         extra={"worker": session.worker_id})
            self.board.forget(session, [a.task_id for a in request.acks])
        if request.nacks:
            await self._nack(session, list(request.nacks))
        if request.draining:
            session.credits = 0
        elif request.credits:
            self.board.add_credits(session, request.credits)

    async def _nack(self, session: Session, nacks: list[scheduler_pb2.Nack]) -> None:
        """Nacked tasks go back after their retry delay: the worker's, or for a counted failure the
        exponential retry backoff of its attempt; at max attempts they are dead-lettered."""
        Key = tuple[str, bool, float]
        by_key: dict[Key, list[tuple[str, int | None]]] = defaultdict(list)
        reasons: dict[Key, str] = {}
        now = now_ms()
        s = self.queues.settings
        for n in nacks:
            held = session.held.pop(n.task_id, None)
            if held is None:
                self.fencing_refusals += 1
                continue
            mac, attempt = held
            delay_s = n.retry_after.ToMilliseconds() / 1000 if n.HasField("retry_after") else 0.0
            if n.count_attempt and not delay_s:
                delay_s = compute_backoff(attempt, base_s=s.retry_backoff_base_s, max_s=s.retry_backoff_max_s,
                                          jitter=False)
            key = (mac, n.count_attempt, round(now + delay_s * 1000, 1))
            by_key[key].append((n.task_id, int(n.lease_token or attempt)))
            reasons[key] = n.reason or "nacked"
        for (mac, counts, retry_at), leases in by_key.items():
            reason = reasons[(mac, counts, retry_at)]
            result = await self.queues.requeue(mac, leases, count_attempt=counts, reason=reason,
                                               retry_at_ms=retry_at, now=now)
            await self.outcomes.dead_lettered(result.dead_letters)

    async def end_session(self, session: Session, reason: str, *, count_attempt: bool = True) -> None:
        """Closes a session and puts back what it held."""
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
