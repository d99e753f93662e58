"""The worker's part of a task's trace, and its task metrics.

`ObservedRunner` wraps the batch runner the Puller calls. For each assignment it opens a "run" span whose
parent is the assignment's traceparent (the scheduler's assign span, itself under the task's Submit), with
task.id, device, task.type, task.priority, attempt and worker.id; the runner reports its phases through
`started`, `detected` and `stored` (module functions that find the current batch in a context variable and
cost a lookup when there is none). When the batch is done, each run span gets its children, laid out on the
times the phases ended:

    run ── mark running (the RUNNING status write, shared by the batch)
        ├─ ocr (OCR_IMAGE: fetch, decode, detect, recognise; timings from the result's details)
        ├─ match (the lexicon match)
        ├─ result write (the group-committed result; result.stored false when a newer attempt owned it)
        └─ ack

A nacked task's run span ends with an error status and the nack reason. Metrics, counted with tracing on
or off: submit→start and start→done latencies by task type, results by type and outcome.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from sieve.db.tasks import Outcome, Started
from sieve.enums import enum_label
from sieve.observe import metrics, telemetry
from sieve.v1 import scheduler_pb2
from sieve.v1.types_pb2 import Priority, TaskType

log = logging.getLogger("sieve.worker.tasks")

Acks = list[scheduler_pb2.Ack]
Nacks = list[scheduler_pb2.Nack]
Runner = Callable[[list[scheduler_pb2.Assignment]], Awaitable[tuple[Acks, Nacks]]]

_current: contextvars.ContextVar[BatchTrace | None] = contextvars.ContextVar("sieve_batch_trace", default=None)


# --- hooks the runner calls -----------------------------------------------------------------------------
def started(tasks: Sequence[Started]) -> None:
    """The batch's tasks that may run were marked RUNNING (the others are skipped)."""
    batch = _current.get()
    if batch is not None:
        batch.started_ns = time.time_ns()
        batch.started = list(tasks)


def detected(outcomes: Sequence[Outcome]) -> None:
    """Detection (OCR, matching) of the started tasks is done."""
    batch = _current.get()
    if batch is not None:
        batch.detected_ns = time.time_ns()
        batch.outcomes = list(outcomes)


def stored(flags: Sequence[bool]) -> None:
    """The results were written; flags[i] tells whether outcome i was stored (False: refused)."""
    batch = _current.get()
    if batch is not None:
        batch.stored_ns = time.time_ns()
        batch.stored = list(flags)


# --- the batch ---------------------------------------------------------------------------------------
class BatchTrace:
    """What one batch did and when; turned into spans and metrics by `finish`."""

    def __init__(self, assignments: list[scheduler_pb2.Assignment], worker_id: str) -> None:
        self.assignments = assignments
        self.worker_id = worker_id
        self.began_ns = time.time_ns()
        self.started_ns = self.detected_ns = self.stored_ns = 0
        self.started: list[Started] = []
        self.outcomes: list[Outcome] = []
        self.stored: list[bool] = []
        self.runs: dict[str, trace.Span] = {}
        if telemetry.enabled():
            tracer = telemetry.tracer()
            for a in assignments:
                self.runs[a.task_id] = tracer.start_span(
                    "run",
                    context=telemetry.context_from(a.traceparent),
                    start_time=self.began_ns,
                    attributes={
                        "task.id": a.task_id,
                        "device": a.device_id,
                        "task.type": enum_label(TaskType, a.type),
                        "task.priority": enum_label(Priority, a.priority),
                        "attempt": a.attempt,
                        "worker.id": worker_id,
                    },
                )

    def finish(self, acks: Acks, nacks: Nacks) -> None:
        done_ns = time.time_ns()
        by_id = {a.task_id: a for a in self.assignments}
        results = {o.task_id: (o, ok) for o, ok in zip(self.outcomes, self.stored, strict=False)}
        # metric children looked up once per type and kind, counts added once per batch (labels() is not free)
        waits: dict[str, Any] = {}
        runs: dict[str, Any] = {}
        counted: Counter[tuple[str, str]] = Counter()
        for task in self.started:
            task_type = task.task_type
            assignment = by_id.get(str(task.task_id))
            if assignment is not None and assignment.HasField("enqueued_at"):
                wait_s = (self.started_ns - assignment.enqueued_at.ToNanoseconds()) / 1e9
                hist = waits.get(task_type) or waits.setdefault(task_type, metrics.SUBMIT_TO_START.labels(task_type))
                hist.observe(max(0.0, wait_s))
            outcome = results.get(task.task_id)
            if outcome is not None and self.stored_ns:
                result, ok = outcome
                counted[task_type, ("succeeded" if result.verdict is not None else "failed") if ok else "refused"] += 1
                if ok:
                    hist = runs.get(task_type) or runs.setdefault(task_type, metrics.START_TO_DONE.labels(task_type))
                    hist.observe((self.stored_ns - self.started_ns) / 1e9)
        for (task_type, kind), n in counted.items():
            metrics.TASK_RESULTS.labels(task_type, kind).inc(n)
        for nack in nacks:
            assignment = by_id.get(nack.task_id)
            task_type = enum_label(TaskType, assignment.type) if assignment else "UNKNOWN"
            metrics.TASK_RESULTS.labels(task_type, "nacked").inc()
            self._nacked(nack, assignment)
        if log.isEnabledFor(logging.DEBUG):
            self._debug(acks, by_id, results)
        if self.runs:
            started = {str(t.task_id): t for t in self.started}
            for ack in acks:
                span = self.runs.pop(ack.task_id, None)
                if span is not None:
                    self._spans(span, started.get(ack.task_id), results, ack, done_ns)
            for span in self.runs.values():  # neither acked nor nacked (cannot happen): end them anyway
                span.end(end_time=done_ns)
            self.runs.clear()

    def _debug(
        self, acks: Acks, by_id: dict[str, scheduler_pb2.Assignment], results: dict[uuid.UUID, tuple[Outcome, bool]]
    ) -> None:
        """One debug line per acked task, in the task's trace."""
        for ack in acks:
            a = by_id.get(ack.task_id)
            outcome = results.get(uuid.UUID(ack.task_id))
            verdict = "skipped" if outcome is None else (outcome[0].verdict or "failed") if outcome[1] else "refused"
            span = self.runs.get(ack.task_id)
            with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
                log.debug(
                    "task %s done: %s",
                    ack.task_id,
                    verdict,
                    extra={
                        "task_id": ack.task_id,
                        "device": a.device_id if a else "",
                        "attempt": a.attempt if a else 0,
                        "worker_id": self.worker_id,
                    },
                )

    def failed(self, exc: BaseException) -> None:
        """The runner raised: the Puller nacks the whole batch."""
        for span in self.runs.values():
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"batch failed: {type(exc).__name__}"))
            span.end()
        self.runs.clear()

    def _nacked(self, nack: scheduler_pb2.Nack, assignment: scheduler_pb2.Assignment | None) -> None:
        span = self.runs.pop(nack.task_id, None)
        extra = {
            "task_id": nack.task_id,
            "device": assignment.device_id if assignment else "",
            "attempt": assignment.attempt if assignment else 0,
            "worker_id": self.worker_id,
        }
        with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
            log.warning("task %s handed back: %s", nack.task_id, nack.reason, extra=extra)
        if span is not None:
            span.add_event("nack", {"reason": nack.reason, "count_attempt": nack.count_attempt})
            span.set_status(Status(StatusCode.ERROR, nack.reason))
            span.end()

    def _spans(
        self,
        run: trace.Span,
        task: Started | None,
        results: dict[uuid.UUID, tuple[Outcome, bool]],
        ack: scheduler_pb2.Ack,
        done_ns: int,
    ) -> None:
        tracer = telemetry.tracer()
        parent = trace.set_span_in_context(run)

        def child(name: str, start: int, end: int, attributes: dict[str, Any] | None = None) -> None:
            tracer.start_span(name, context=parent, start_time=start, attributes=attributes).end(end_time=end)

        if task is None:  # already final, cancelled or owned by a newer attempt: acked without running
            run.set_attribute("run.skipped", True)
        elif self.started_ns:
            child("mark running", self.began_ns, self.started_ns)
            detect_end = self.detected_ns or done_ns
            if task.task_type == "OCR_IMAGE":
                ocr_end, timings = _ocr_split(results.get(task.task_id), self.started_ns, detect_end)
                child("ocr", self.started_ns, ocr_end, {f"ocr.{k}_ms": v for k, v in timings.items()})
                child("match", ocr_end, detect_end)
            else:
                child("match", self.started_ns, detect_end)
            outcome = results.get(task.task_id)
            if outcome is not None and self.stored_ns:
                result, ok = outcome
                child(
                    "result write",
                    detect_end,
                    self.stored_ns,
                    {"result.stored": ok, "result.verdict": result.verdict or "", "result.error": result.error or ""},
                )
                if result.verdict is None:
                    run.set_status(Status(StatusCode.ERROR, result.error or "failed"))
        child("ack", self.stored_ns or done_ns, done_ns, {"lease_token": ack.lease_token})
        run.end(end_time=done_ns)


def _ocr_split(outcome: tuple[Outcome, bool] | None, start_ns: int, end_ns: int) -> tuple[int, dict[str, float]]:
    """Where OCR ended and matching began, from the result's timings_ms (else all of it is OCR)."""
    if outcome is None:
        return end_ns, {}
    try:
        timings = json.loads(outcome[0].details_json).get("timings_ms", {})
        ocr_ms = float(timings.get("total", 0)) - float(timings.get("match", 0))
    except (ValueError, AttributeError, TypeError):
        return end_ns, {}
    numbers = {k: float(v) for k, v in timings.items() if isinstance(v, int | float)}
    if ocr_ms <= 0:
        return end_ns, numbers
    return min(end_ns, start_ns + int(ocr_ms * 1e6)), numbers


class ObservedRunner:
    """The batch runner, with each batch's spans and metrics around it."""

    def __init__(self, runner: Runner, worker_id: str) -> None:
        self.runner = runner
        self.worker_id = worker_id

    async def __call__(self, assignments: list[scheduler_pb2.Assignment]) -> tuple[Acks, Nacks]:
        batch = BatchTrace(assignments, self.worker_id)
        token = _current.set(batch)
        try:
            acks, nacks = await self.runner(assignments)
        except BaseException as exc:
            batch.failed(exc)
            raise
        finally:
            _current.reset(token)
        batch.finish(acks, nacks)
        return acks, nacks


__all__ = ["BatchTrace", "ObservedRunner", "detected", "started", "stored"]
