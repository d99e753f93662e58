"""The SchedulerService RPCs: the workers' Pull streams, GetWatermark, the dead letters and the audit log.

Each RPC delegates: a Pull stream's messages to `scheduler_svc.streams` (the protocol), the watermark to
`scheduler_svc.watermark`, the operators' dead-letter actions to `scheduler_svc.dead_letters`, the audit log to
`scheduler_svc.audit_rpc`. The Pull method itself is the stream: who may open one (a worker credential, as the
worker id it names; a valid first WorkerHello), sending the batches, and ending it (the worker went away, its
credential was revoked, the scheduler shuts down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import grpc

from scheduler_svc.audit_rpc import list_audit_events
from scheduler_svc.board import Board
from scheduler_svc.dead_letters import DeadLetters, Filter, to_proto
from scheduler_svc.sessions import Session
from scheduler_svc.slot_pools import SlotPoolView
from scheduler_svc.streams import PullStreams, hello_problem
from scheduler_svc.watermark import Watermark
from sieve import rpc
from sieve.coalesce import coalesce
from sieve.errors import InvalidInput
from sieve.observe import telemetry
from sieve.rpc.auth import current_credential_valid, current_principal
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("sieve.scheduler.pull")

Context = grpc.aio.ServicerContext[Any, Any]

#: how often an open stream's credential is checked again (a revoked one ends the stream)
CREDENTIAL_RECHECK_S = 1.0


def _append_batch(first: scheduler_pb2.PullResponse, later: scheduler_pb2.PullResponse) -> None:
    first.batch.assignments.extend(later.batch.assignments)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    """The scheduler's RPCs (see the module): each one checks its request and delegates; Pull opens, feeds and ends
    the workers' streams, whose messages `PullStreams` handles."""

    def __init__(
        self,
        streams: PullStreams,
        board: Board,
        watermark: Watermark,
        dead_letters: DeadLetters,
        pools: SlotPoolView | None = None,
    ) -> None:
        self.streams = streams
        self.pools = pools
        self.board = board
        self.watermark = watermark
        self.dead_letters = dead_letters
        self._accepting = True

    def stop_accepting(self) -> None:
        """New streams are refused (UNAVAILABLE: the worker reconnects elsewhere) from now on."""
        self._accepting = False

    async def Pull(
        self, request_iterator: AsyncIterator[scheduler_pb2.PullRequest], context: Context
    ) -> AsyncIterator[scheduler_pb2.PullResponse]:
        if not self._accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler is shutting down; reconnect")
        principal = current_principal.get()
        first = await self._first_message(context)
        if not principal.may_act_as_worker(first.hello.worker_id):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"credential {principal.name!r} may not act as this worker id"
            )
        assert self.board.signer is not None
        await self.board.signer.ensure()
        session = self.board.open(first.hello, anonymous=principal.anonymous)
        log.info("worker %s connected", session.worker_id, extra={"worker": session.worker_id})
        try:
            await self.streams.start(session, first)
        except Exception:
            await self.streams.end_session(session, "worker gone: its stream closed")
            raise
        # the headers tell the worker its stream is open and registered, before any work comes
        await context.send_initial_metadata(())
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
            if revoked.is_set():  # what it held goes back (before the stream ends); it gets nothing more
                log.warning(
                    "worker %s: credential revoked, stream ended",
                    session.worker_id,
                    extra={"worker": session.worker_id},
                )
                await self.streams.end_session(session, "worker gone: its credential was revoked")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the credential of this stream was revoked")
        finally:
            for task in (reader, guard):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.streams.end_session(session, "worker gone: its stream closed")

    @staticmethod
    async def _first_message(context: Context) -> scheduler_pb2.PullRequest:
        """The stream's first message, a valid WorkerHello (the stream is ended INVALID_ARGUMENT otherwise)."""
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello") or not first.hello.worker_id:
            await rpc.abort(context, rpc.invalid_argument("hello", "the first message must be a WorkerHello"))
        if not first.hello.task_types:
            await rpc.abort(context, rpc.invalid_argument("hello.task_types", "is empty"))
        problem = hello_problem(first.hello)
        if problem is not None:
            await rpc.abort(context, rpc.invalid_argument(*problem))
        return cast(scheduler_pb2.PullRequest, first)

    @staticmethod
    async def _watch_credential(session: Session, valid: Callable[[], bool], revoked: asyncio.Event) -> None:
        """Ends the stream (within about a second) once its credential is revoked."""
        while not session.closed:
            await asyncio.sleep(CREDENTIAL_RECHECK_S)
            if not valid():
                revoked.set()
                session.end_stream()
                return

    async def _read(self, session: Session, context: Context) -> None:
        try:
            while True:
                request = await context.read()
                if request is grpc.aio.EOF:
                    break
                await self.streams.handle(session, request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("worker %s stream broke: %s", session.worker_id, exc)
        finally:
            session.end_stream()

    async def GetWatermark(
        self, request: scheduler_pb2.GetWatermarkRequest, context: Context
    ) -> scheduler_pb2.GetWatermarkResponse:
        return await self.watermark.read()

    # --- dead letters ----------------------------------------------------------------------------
    async def _filter(
        self, f: scheduler_pb2.DeadLetterFilter, context: Context, *, everything: bool | None = None
    ) -> Filter:
        """The request's filter; with `everything` given, an empty filter needs it to be true."""
        try:
            flt = Filter.from_proto(f)
            if everything is False and flt.empty:
                raise InvalidInput("all", "must be true to act on every dead letter with an empty filter")
            return flt
        except InvalidInput as exc:
            await rpc.abort(context, rpc.invalid_argument(exc.field, exc.description))
            raise

    async def ListDeadLetters(
        self, request: scheduler_pb2.ListDeadLettersRequest, context: Context
    ) -> scheduler_pb2.ListDeadLettersResponse:
        records, total = await self.dead_letters.page(await self._filter(request.filter, context), request.limit)
        return scheduler_pb2.ListDeadLettersResponse(dead_letters=[to_proto(r) for r in records], total=total)

    async def RequeueDeadLetters(
        self, request: scheduler_pb2.RequeueDeadLettersRequest, context: Context
    ) -> scheduler_pb2.RequeueDeadLettersResponse:
        flt = await self._filter(request.filter, context, everything=request.all)
        return scheduler_pb2.RequeueDeadLettersResponse(task_ids=await self.dead_letters.requeue(flt))

    async def PurgeDeadLetters(
        self, request: scheduler_pb2.PurgeDeadLettersRequest, context: Context
    ) -> scheduler_pb2.PurgeDeadLettersResponse:
        purged = await self.dead_letters.purge(await self._filter(request.filter, context, everything=request.all))
        return scheduler_pb2.PurgeDeadLettersResponse(purged=purged)

    async def ListAuditEvents(
        self, request: scheduler_pb2.ListAuditEventsRequest, context: Context
    ) -> scheduler_pb2.ListAuditEventsResponse:
        return await list_audit_events(request, context)

    async def ListSlotPools(
        self, request: scheduler_pb2.ListSlotPoolsRequest, context: Context
    ) -> scheduler_pb2.ListSlotPoolsResponse:
        if self.pools is None:
            return scheduler_pb2.ListSlotPoolsResponse()
        return await self.pools.list()
