"""The intake's telemetry hooks: the Submit trace stored with each task, the enqueue span, submit counts.

`stamp_trace` puts the traceparent of the current span (the Submit / SubmitBatch server span) on the new
tasks, so that it is stored in `tasks.trace_context` and travels in the queue entry (`Entry.trace`); the
scheduler and the worker continue that trace. With tracing off it returns the batch untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import trace

from sieve import metrics, telemetry
from sieve.db.tasks import NewTask

if TYPE_CHECKING:
    from intake_svc.submission import Decision
    from sieve.entry import Entry

D = TypeVar("D", bound="Decision")


def stamp_trace(batch: list[NewTask]) -> list[NewTask]:
    """The batch with the current span's traceparent as each task's trace_context (when one is recorded)."""
    if not telemetry.enabled():
        return batch
    traceparent = telemetry.current_traceparent()
    if not traceparent:
        return batch
    return [t if t.trace_context else dataclasses.replace(t, trace_context=traceparent) for t in batch]


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


def count_decisions(decisions: Sequence[D]) -> list[D]:
    """Counts accepted, deduplicated and refused tasks; returns the decisions unchanged."""
    from intake_svc.submission import Accepted, Refused

    for d in decisions:
        if isinstance(d, Accepted):
            metrics.SUBMITTED.labels("deduplicated" if d.deduplicated else "accepted").inc()
        elif isinstance(d, Refused):
            metrics.REJECTIONS.labels(d.reason).inc()
    return list(decisions)
