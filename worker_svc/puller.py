"""The worker's side of the Pull stream: hold slots, send credits, run batches, ack, reconnect.

Slots: the worker has `concurrency` slots. A credit is sent only for a free slot, and only while the
worker is not holding back (`worker_svc.pressure`: backpressure); a slot is used from the moment an
assignment arrives until its ack is sent. When the worker starts holding back it also withdraws the credits
the scheduler still has (a `draining` message: unused credits dropped; credits sent later count again), so
that work goes to other workers meanwhile; a batch that was already on its way is put back at once (the
execution-time check), uncounted, with a retry delay from the pressure's own estimate (seconds, not a fixed
30 s). When the stream breaks the worker reconnects with jittered exponential backoff (at most
`SIEVE_WORKER_RECONNECT_MAX_S`) and re-announces what it holds: the first hello of the new stream lists the
assignments it is still running and those whose ack or nack may not have arrived (sent in the last
IN_DOUBT_S, or produced while no stream was open), and carries those acks and nacks. A new scheduler process
(the old one died) adopts those leases and settles them at once; a live scheduler already put back what the old
stream held when it ended, so those leases are gone and their late settlements are dropped or refused.

A batch whose run raises is nacked whole, each task's attempt counted. Work the runner abandoned past its
execution timeout but whose thread cannot be stopped (a hung OCR inference) keeps its slot until the thread
returns (`SlotHolds`): the task itself is nacked at once, but no credit is granted for that slot meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import grpc

from sieve import rpc
from sieve.backoff import Backoff
from sieve.coalesce import coalesce
from sieve.enums import enum_label, enum_value
from sieve.observe import metrics, telemetry
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from worker_svc.pressure import Pressure

log = logging.getLogger("sieve.worker.pull")

#: how often withheld credits are reconsidered while the worker is under pressure
PRESSURE_RECHECK_S = 0.25
#: acks and nacks sent this recently on a stream that broke may not have arrived: re-announced on the next one
IN_DOUBT_S = 10.0
#: most leases one reconnecting hello re-announces (the scheduler honours as many settlements per message)
MAX_REANNOUNCED = 10_000

Settlement = scheduler_pb2.Ack | scheduler_pb2.Nack


class SlotHolds:
    """Slots of abandoned work that still runs in a thread: task id -> the future of that thread's job."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[object]] = {}

    def hold(self, task_id: str, future: asyncio.Future[object]) -> None:
        self._futures[task_id] = future
        future.add_done_callback(lambda _f: self._futures.pop(task_id, None))

    def take(self, task_ids: Iterable[str]) -> list[asyncio.Future[object]]:
        """The futures of these tasks whose work still runs (they stay counted until done)."""
        return [f for t in task_ids if (f := self._futures.get(t)) is not None and not f.done()]

    def __len__(self) -> int:
        return sum(1 for f in self._futures.values() if not f.done())


BatchRunner = Callable[
    [list[scheduler_pb2.Assignment]], Awaitable[tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]]
]


class Puller:
    """One worker's Pull stream: its slots, the credits it granted, and the batches it runs.

    Owns the credit rule (a credit only for a free slot, none while `Pressure` holds the worker back or it
    drains), the stream's outbox, the assignments not settled yet and the settlements a broken stream may not
    have delivered (re-announced in the next hello); `run` keeps a stream open until it is told to stop."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        task_types: list[int],
        gpu: bool,
        concurrency: int,
        run_batch: BatchRunner,
        pressure: Pressure,
        *,
        credit_limit: Callable[[], int] | None = None,
        one_per_batch: bool = False,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.task_types = task_types
        self.gpu = gpu
        self.concurrency = concurrency
        self.run_batch = run_batch
        self.pressure = pressure
        #: a cap on the credits granted beyond the free slots (the external engine: its pools' free slots)
        self.credit_limit = credit_limit
        #: each assignment of a batch runs and settles on its own (external jobs last minutes each)
        self.one_per_batch = one_per_batch
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
        #: abandoned work still in a thread (set by the worker: its runner's holds)
        self.holds: SlotHolds | None = None
        #: assignments received and not settled yet (re-announced on a new stream)
        self._assigned: dict[str, scheduler_pb2.Assignment] = {}
        #: (when, settlement) sent on the current stream lately; settlements owed to the next stream
        self._recent: deque[tuple[float, Settlement]] = deque(maxlen=MAX_REANNOUNCED)
        self._owed: list[Settlement] = []
        #: streams opened after one broke, and the leases their first hello re-announced
        self.reconnects = 0
        self.reannounced = 0

    # --- credits ----------------------------------------------------------------------------------
    @property
    def credits_granted(self) -> int:
        """Credits the current stream granted and the scheduler has not used yet."""
        return self._granted

    def _free_credits(self) -> int:
        if self.draining or self._pressure():
            return 0
        room = self.concurrency - self.in_use
        if self.credit_limit is not None:
            room = min(room, self.credit_limit())
        return max(0, room - self._granted)

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
        else:  # no stream: the settlements go with the next one's hello
            self._owed.extend(request.acks)
            self._owed.extend(request.nacks)

    def _grant(self, request: scheduler_pb2.PullRequest) -> scheduler_pb2.PullRequest:
        credits = self._free_credits()
        if credits:
            request.credits = credits
            self._granted += credits
        return request

    def _hello(self) -> scheduler_pb2.WorkerHello:
        return scheduler_pb2.WorkerHello(
            worker_id=self.worker_id,
            gpu=self.gpu,
            task_types=[enum_value(types_pb2.TaskType, t) for t in self.task_types],
        )

    def _first_request(self) -> scheduler_pb2.PullRequest:
        """The hello of a new stream; after a broken one it re-announces the leases still held (running ones and
        those whose settlement is owed) and carries the owed acks and nacks."""
        request = scheduler_pb2.PullRequest(hello=self._hello())
        owed, self._owed = self._owed[-MAX_REANNOUNCED:], []
        running = list(self._assigned.values())[: max(0, MAX_REANNOUNCED - len(owed))]
        for a in running:
            request.hello.held.add(task_id=a.task_id, lease_token=a.lease_token, assigned_at=a.assigned_at)
        settled = {a.task_id for a in running}
        for item in owed:
            if item.task_id not in settled:
                request.hello.held.add(task_id=item.task_id, lease_token=item.lease_token)
            if isinstance(item, scheduler_pb2.Ack):
                request.acks.append(item)
            else:
                request.nacks.append(item)
        if request.hello.held:
            self.reconnects += 1
            self.reannounced += len(request.hello.held)
            log.info(
                "re-announcing %d leases (%d running, %d acks and nacks owed)",
                len(request.hello.held),
                len(running),
                len(owed),
            )
        return request

    def _note_sent(self, request: scheduler_pb2.PullRequest) -> None:
        if request.acks or request.nacks:
            now = time.monotonic()
            settled: list[Settlement] = [*request.acks, *request.nacks]
            self._recent.extend((now, item) for item in settled)

    def _stream_ended(self, outbox: asyncio.Queue[scheduler_pb2.PullRequest | None]) -> None:
        """What the broken stream may not have delivered becomes owed to the next one: settlements never taken
        from its outbox, and those sent in the last IN_DOUBT_S."""
        unsent: list[Settlement] = []
        while not outbox.empty():
            item = outbox.get_nowait()
            if item is not None:
                unsent.extend((*item.acks, *item.nacks))
        horizon = time.monotonic() - min(IN_DOUBT_S, self.settings.lease_ttl_s)
        doubtful = [item for at, item in self._recent if at >= horizon]
        self._recent.clear()
        self._owed = [*doubtful, *unsent, *self._owed][-MAX_REANNOUNCED:]

    def announce(self) -> None:
        """Tells the scheduler this worker's capabilities again (its GPU mode changed) on the open stream;
        a stream opened later starts with them anyway."""
        self._send(scheduler_pb2.PullRequest(hello=self._hello()))

    # --- the stream -------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Keeps a Pull stream open until `stop` is set and the in-flight work is done."""
        backoff = Backoff(max_s=self.settings.worker_reconnect_max_s)
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
        outbox.put_nowait(self._grant(self._first_request()))

        async def requests() -> AsyncIterator[scheduler_pb2.PullRequest]:
            while True:
                item = await outbox.get()
                if item is None:
                    return
                closing = coalesce(outbox, item, merge_into)
                self._note_sent(item)
                yield item
                if closing:
                    return

        async with rpc.channel(self.settings.scheduler_addr, self.settings) as channel:
            call = scheduler_pb2_grpc.SchedulerServiceStub(channel).Pull(requests())
            watcher = asyncio.create_task(self._watch(stop, outbox))
            try:
                await call.initial_metadata()  # the scheduler sends its headers once the session is open
                if not call.done():  # (a refused stream ends with no headers of its own)
                    self.connected.set()
                async for response in call:
                    if response.HasField("batch"):
                        self._start_batch(list(response.batch.assignments))
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                self._outbox = None
                self._stream_ended(outbox)

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
        for a in assignments:
            self._assigned[a.task_id] = a
        # each task's spans hang off its own trace, not off this long-lived stream's
        for batch in [[a] for a in assignments] if self.one_per_batch else [assignments]:
            task = asyncio.create_task(self._batch(batch), context=telemetry.detached_context())
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
        except Exception as exc:  # each task's attempt counts: it may be what broke the batch
            log.exception(
                "batch of %d failed",
                len(assignments),
                extra={"task_ids": [a.task_id for a in assignments], "worker_id": self.worker_id},
            )
            acks, nacks = (
                [],
                [
                    scheduler_pb2.Nack(
                        task_id=a.task_id,
                        lease_token=a.lease_token,
                        reason=f"worker error: {type(exc).__name__}: {exc}"[:500],
                        count_attempt=True,
                    )
                    for a in assignments
                ],
            )
            for a in assignments:
                metrics.TASK_NACKS.labels(enum_label(types_pb2.TaskType, a.type), "batch_error").inc()
        lingering = self.holds.take(a.task_id for a in assignments) if self.holds is not None else []
        self.in_use -= len(assignments) - len(lingering)
        for future in lingering:  # a hung thread keeps its slot until it returns
            future.add_done_callback(self._slot_freed)
        for a in assignments:
            self._assigned.pop(a.task_id, None)
        self.completed += len(acks)
        self._send(self._grant(scheduler_pb2.PullRequest(acks=acks, nacks=nacks)))

    def offer_credits(self) -> None:
        """Grants the credits free now on the open stream at once (the external engine's slot was released), instead
        of at the next pressure recheck."""
        if self._outbox is not None and self._free_credits():
            self._send(self._grant(scheduler_pb2.PullRequest()))

    def cancel_running(self) -> None:
        """Cancels the batches still running (a process that stops without waiting for them)."""
        for task in list(self._running):
            task.cancel()

    def _slot_freed(self, _future: asyncio.Future[object]) -> None:
        self.in_use -= 1

    @staticmethod
    def _pressure_nack(assignment: scheduler_pb2.Assignment, reasons: list[str], retry_s: float) -> scheduler_pb2.Nack:
        nack = scheduler_pb2.Nack(
            task_id=assignment.task_id,
            lease_token=assignment.lease_token,
            reason="worker over watermark: " + "; ".join(reasons),
            count_attempt=False,
        )
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
