"""The worker's side of the Pull stream: hold slots, send credits, run batches, ack, reconnect.

Slots: the worker has `concurrency` slots. A credit is sent only for a free slot, and only while the
worker is not holding back (`worker_svc.pressure`: backpressure); a slot is used from the moment an
assignment arrives until its ack is sent. When the worker starts holding back it also withdraws the credits
the scheduler still has (a `draining` message: unused credits dropped; credits sent later count again), so
that work goes to other workers meanwhile; a batch that was already on its way is put back at once (the
execution-time check), uncounted, with a retry delay from the pressure's own estimate (seconds, not a fixed
30 s). When the stream breaks the worker reconnects with jittered exponential backoff; tasks it was running
are put back by the scheduler and their late acks are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from sieve import rpc, telemetry
from sieve.backoff import Backoff
from sieve.coalesce import coalesce
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc
from worker_svc.pressure import Pressure

log = logging.getLogger("sieve.worker.pull")

#: how often withheld credits are reconsidered while the worker is under pressure
PRESSURE_RECHECK_S = 0.25

BatchRunner = Callable[[list[scheduler_pb2.Assignment]], Awaitable[tuple[list[scheduler_pb2.Ack],
                                                                          list[scheduler_pb2.Nack]]]]


class Puller:
    """One worker's Pull stream: its slots, the credits it granted, and the batches it runs."""

    def __init__(self, settings: Settings, worker_id: str, task_types: list[int], gpu: bool,
                 concurrency: int, run_batch: BatchRunner, pressure: Pressure) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.task_types = task_types
        self.gpu = gpu
        self.concurrency = concurrency
        self.run_batch = run_batch
        self.pressure = pressure
        self.in_use = 0
        self._granted = 0  # credits the current stream has and has not used yet
        self._outbox: asyncio.Queue[scheduler_pb2.PullRequest | None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.draining = False
        self.connected = asyncio.Event()
        self.completed = 0
        #: tasks put back because they arrived while the worker held back
        self.pressure_nacks = 0
        self._withheld = False  # holding back: credits withdrawn, none granted
        self._last_sent = 0.0

    # --- credits ----------------------------------------------------------------------------------
    @property
    def credits_granted(self) -> int:
        """Credits the current stream granted and the scheduler has not used yet."""
        return self._granted

    def _free_credits(self) -> int:
        if self.draining or self._pressure():
            return 0
        return max(0, self.concurrency - self.in_use - self._granted)

    def _pressure(self) -> list[str]:
        """The pressure check; on the way into holding back, the credits the scheduler has are withdrawn."""
        reasons = self.pressure.reasons(self.in_use)
        if reasons and not self._withheld:
            self._withheld = True
            if self._granted and self._outbox is not None:
                self._granted = 0
                self._send(scheduler_pb2.PullRequest(draining=True))
        elif not reasons:
            self._withheld = False
        return reasons

    def _send(self, request: scheduler_pb2.PullRequest) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(request)
            self._last_sent = time.monotonic()

    def _grant(self, request: scheduler_pb2.PullRequest) -> scheduler_pb2.PullRequest:
        credits = self._free_credits()
        if credits:
            request.credits = credits
            self._granted += credits
        return request

    def _hello(self) -> scheduler_pb2.WorkerHello:
        return scheduler_pb2.WorkerHello(worker_id=self.worker_id, task_types=self.task_types, gpu=self.gpu)

    def announce(self) -> None:
        """Tells the scheduler this worker's capabilities again (its GPU mode changed) on the open stream;
        a stream opened later starts with them anyway."""
        self._send(scheduler_pb2.PullRequest(hello=self._hello()))

    # --- the stream -------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Keeps a Pull stream open until `stop` is set and the in-flight work is done."""
        backoff = Backoff()
        while not (stop.is_set() and self.draining):
            try:
                await self._stream(stop)
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.warning("pull stream ended: %s %s", exc.code().name, exc.details())
            except Exception:
                log.exception("pull stream failed")
            finally:
                self.connected.clear()
            if self.draining:
                break
            await asyncio.sleep(backoff.next())

    async def _stream(self, stop: asyncio.Event) -> None:
        outbox: asyncio.Queue[scheduler_pb2.PullRequest | None] = asyncio.Queue()
        self._outbox = outbox
        self._granted = 0
        outbox.put_nowait(self._grant(scheduler_pb2.PullRequest(hello=self._hello())))

        async def requests() -> AsyncIterator[scheduler_pb2.PullRequest]:
            while True:
                item = await outbox.get()
                if item is None:
                    return
                closing = coalesce(outbox, item, merge_into)
                yield item
                if closing:
                    return

        async with rpc.channel(self.settings.scheduler_addr, self.settings) as channel:
            call = scheduler_pb2_grpc.SchedulerServiceStub(channel).Pull(requests())
            watcher = asyncio.create_task(self._watch(stop, outbox))
            try:
                async for response in call:
                    self.connected.set()
                    if response.HasField("batch"):
                        self._start_batch(list(response.batch.assignments))
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                self._outbox = None

    async def _watch(self, stop: asyncio.Event, outbox: asyncio.Queue[scheduler_pb2.PullRequest | None]) -> None:
        """Grants withheld credits when pressure clears, says "still working" often enough that the
        scheduler keeps renewing this worker's leases, and on stop drains and closes the stream."""
        keepalive_s = self.settings.lease_ttl_s / 3
        while True:
            if stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(PRESSURE_RECHECK_S, keepalive_s))
            if stop.is_set():
                break
            if self._free_credits():
                self._send(self._grant(scheduler_pb2.PullRequest()))
            elif time.monotonic() - self._last_sent >= keepalive_s:
                self._send(scheduler_pb2.PullRequest())
        # ordered shutdown: no new credits, finish what is in flight (acks go out), then close
        self.draining = True
        outbox.put_nowait(scheduler_pb2.PullRequest(draining=True))
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)
        outbox.put_nowait(None)

    # --- batches ----------------------------------------------------------------------------------
    def _start_batch(self, assignments: list[scheduler_pb2.Assignment]) -> None:
        n = len(assignments)
        self._granted = max(0, self._granted - n)
        self.in_use += n
        # each task's spans hang off its own trace, not off this long-lived stream's
        task = asyncio.create_task(self._batch(assignments), context=telemetry.detached_context())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _batch(self, assignments: list[scheduler_pb2.Assignment]) -> None:
        try:
            reasons = self._pressure()
            if reasons:
                acks: list[scheduler_pb2.Ack] = []
                retry_s = self.pressure.retry_after_s()
                nacks = [self._pressure_nack(a, reasons, retry_s) for a in assignments]
                self.pressure_nacks += len(nacks)
            else:
                acks, nacks = await self.run_batch(assignments)
        except Exception as exc:
            log.exception("batch of %d failed", len(assignments),
                          extra={"task_ids": [a.task_id for a in assignments], "worker_id": self.worker_id})
            acks, nacks = [], [scheduler_pb2.Nack(task_id=a.task_id, lease_token=a.lease_token,
                                                  reason=f"worker error: {exc}", count_attempt=False)
                               for a in assignments]
        self.in_use -= len(assignments)
        self.completed += len(acks)
        self._send(self._grant(scheduler_pb2.PullRequest(acks=acks, nacks=nacks)))

    @staticmethod
    def _pressure_nack(assignment: scheduler_pb2.Assignment, reasons: list[str],
                       retry_s: float) -> scheduler_pb2.Nack:
        nack = scheduler_pb2.Nack(task_id=assignment.task_id, lease_token=assignment.lease_token,
                                  reason="worker over watermark: " + "; ".join(reasons), count_attempt=False)
        nack.retry_after.FromMilliseconds(int(retry_s * 1000))
        return nack


def merge_into(first: scheduler_pb2.PullRequest, later: scheduler_pb2.PullRequest) -> None:
    """Folds a later request into the first: acks and nacks appended, credits added, the later hello wins.
    A later draining (credits withdrawn) drops the credits granted before it; credits granted after a
    withdrawal cancel it (the scheduler reads a message's draining before its credits and ignores them then;
    a worker that is shutting down grants none)."""
    if later.HasField("hello"):
        first.hello.CopyFrom(later.hello)
    first.acks.extend(later.acks)
    first.nacks.extend(later.nacks)
    if later.draining:
        first.draining, first.credits = True, 0
    elif later.credits:
        first.draining = False
        first.credits += later.credits


def new_worker_id() -> str:
    return uuid.uuid4().hex[:12]
