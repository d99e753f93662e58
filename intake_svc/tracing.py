"""The intake's telemetry hooks: the Submit trace stored with each task, the enqueue span, submit counts and
the time of each submit step.

`stamp_trace` puts a traceparent on the new tasks — the Submit server span's, or for each task of a
SubmitBatch its own root span's, linked to the batch — so that it is stored in `tasks.trace_context` and
travels in the queue entry (`Entry.trace`); the scheduler and the worker continue that trace. With tracing
off it returns the batch untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from intake_svc.decisions import Accepted, Decision, Refused
from sieve.db.tasks import NewTask
from sieve.enums import enum_name
from sieve.observe import metrics, telemetry
from sieve.v1.types_pb2 import TaskType

if TYPE_CHECKING:
    from sieve.redis.entry import Entry

D = TypeVar("D", bound=Decision)


def stamp_trace(batch: list[NewTask]) -> list[NewTask]:
    """The batch with a trace context on each task (when the current span is recorded).

    One task (Submit) continues the Submit's own trace. Each task of a larger batch (SubmitBatch) gets a
    trace of its own, so that one trace is one task's life: its root span "submit task" carries the task's
    attributes and links to the SubmitBatch span that accepted it."""
    if not telemetry.enabled():
        return batch
    current = trace.get_current_span()
    traceparent = telemetry.traceparent_of(current) if current.is_recording() else ""
    if not traceparent:
        return batch
    if len(batch) == 1:
        return [t if t.trace_context else dataclasses.replace(t, trace_context=traceparent) for t in batch]
    tracer = telemetry.tracer()
    accepted_by = [trace.Link(current.get_span_context())]
    stamped = []
    for t in batch:
        if t.trace_context:
            stamped.append(t)
            continue
        span = tracer.start_span(
            "submit task",
            context=otel_context.Context(),
            kind=trace.SpanKind.INTERNAL,
            links=accepted_by,
            attributes={"task.id": str(t.task_id), "device": t.device, "task.type": enum_name(TaskType, t.task_type)},
        )
        span.end()
        stamped.append(dataclasses.replace(t, trace_context=telemetry.traceparent_of(span)))
    return stamped


@contextlib.contextmanager
def enqueue_span(groups: dict[str, list[Entry]]) -> Iterator[None]:
    """The "enqueue" span around the Redis enqueue of a Submit's tasks (nothing when tracing is off)."""
    if not telemetry.enabled():
        yield
        return
    entries = [e for group in groups.values() for e in group]
    attributes: dict[str, str | int] = {"tasks.count": len(entries), "devices.count": len(groups)}
    if len(entries) == 1:
        attributes.update({"task.id": entries[0].task_id, "device": next(iter(groups))})
    with telemetry.tracer().start_as_current_span("enqueue", kind=trace.SpanKind.INTERNAL, attributes=attributes):
        yield


@contextlib.contextmanager
def step_timer(step: str) -> Iterator[None]:
    """Times one step of accepting a Submit's tasks (`sieve_submit_step_seconds`), whether it ends or raises."""
    began = time.perf_counter()
    try:
        yield
    finally:
        metrics.SUBMIT_STEP_SECONDS.labels(step).observe(time.perf_counter() - began)


def count_decisions(decisions: Sequence[D]) -> list[D]:
    """Counts accepted, deduplicated and refused tasks; returns the decisions unchanged."""
    for d in decisions:
        if isinstance(d, Accepted):
            metrics.SUBMITTED.labels("deduplicated" if d.deduplicated else "accepted").inc()
        elif isinstance(d, Refused):
            metrics.REJECTIONS.labels(d.reason).inc()
    return list(decisions)
