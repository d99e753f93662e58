"""The scheduler's part of a task's trace, and the dispatch metrics.

Per dispatched task (so that each task keeps its own trace): a "claim" span, child of the task's Submit
span (the traceparent in its queue entry), from the start of the pop that claimed it to its end; then an
"assign" span, child of the claim, until the task is on its way to a worker (or put back). The worker
continues from the assign span: the assignment carries the assign span's traceparent, not the Submit's.
Attributes: task.id, device, task.type, task.priority, attempt, and worker.id on assign.

With tracing off, `claimed` returns the entries it was given and no span is made; the metrics (claims,
queue waits, batch sizes) are counted either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace

from scheduler_svc.board import Placement
from scheduler_svc.console.tally import Tally
from scheduler_svc.sessions import Session
from sieve.enums import enum_label, enum_name
from sieve.observe import metrics, telemetry
from sieve.redis.entry import Entry
from sieve.v1.types_pb2 import Priority, TaskType

log = logging.getLogger("sieve.scheduler.tasks")

#: open assign spans kept at most (a hand-out that failed half-way leaves its spans; they are dropped)
MAX_OPEN = 10_000


def task_attributes(entry: Entry, device: str) -> dict[str, str | int]:
    return {
        "task.id": entry.task_id,
        "device": device,
        "task.type": enum_name(TaskType, entry.task_type),
        "task.priority": enum_label(Priority, entry.priority),
        "attempt": entry.attempt,
    }


class DispatchObserver:
    """Spans and metrics of the dispatch loop; one per Dispatcher."""

    def __init__(self) -> None:
        self._assigning: dict[str, trace.Span] = {}
        # metric children, looked up once (labels() costs more than the observation itself)
        self._claims = {starving: metrics.CLAIMS.labels("true" if starving else "false") for starving in (False, True)}
        self._queue_wait: dict[int, Any] = {}
        #: the web console's counts (scheduler_svc/console/tally.py), when a console runs
        self.tally: Tally | None = None

    @staticmethod
    def claim_started() -> int:
        """The time a claim (pop) starts, in ns."""
        return time.time_ns()

    def claimed(self, device: str, entries: list[Entry], started_ns: int, starving: bool = False) -> list[Entry]:
        """Counts the claim and each task's queue wait; with tracing on, makes each task's claim span and
        opens its assign span, and returns the entries carrying the assign span's traceparent."""
        if not entries:
            return entries
        self._claims[starving].inc()
        now_ms = time.time() * 1000
        waits_ms = [max(0.0, now_ms - e.enqueued_ms) for e in entries]
        for e, wait_ms in zip(entries, waits_ms, strict=True):
            child = self._queue_wait.get(e.priority)
            if child is None:
                child = self._queue_wait[e.priority] = metrics.QUEUE_WAIT.labels(enum_label(Priority, e.priority))
            child.observe(wait_ms / 1000)
        if self.tally is not None:
            self.tally.claimed(device, waits_ms)
        if not telemetry.enabled():
            return entries
        if len(self._assigning) > MAX_OPEN:
            self._drop_open()
        tracer = telemetry.tracer()
        now_ns = time.time_ns()
        out: list[Entry] = []
        for e in entries:
            attributes = task_attributes(e, device)
            claim = tracer.start_span(
                "claim",
                context=telemetry.context_from(e.trace),
                start_time=started_ns,
                attributes={**attributes, "claim.starving": starving},
            )
            claim.end(end_time=now_ns)
            assign = tracer.start_span(
                "assign", context=trace.set_span_in_context(claim), start_time=now_ns, attributes=attributes
            )
            self._assigning[e.task_id] = assign
            out.append(dataclasses.replace(e, trace=telemetry.traceparent_of(assign)))
        return out

    def sent(self, session: Session, items: Sequence[tuple[str, Entry]]) -> None:
        """A batch of (device, entry) went to a worker: its size is counted and its tasks' assign spans end (a
        debug line each, with the task's trace)."""
        metrics.DISPATCH_BATCH_SIZE.observe(len(items))
        debug = log.isEnabledFor(logging.DEBUG)
        if not (self._assigning or debug):
            return
        for device, e in items:
            span = self._assigning.pop(e.task_id, None)
            if debug:
                with trace.use_span(span, end_on_exit=False) if span is not None else contextlib.nullcontext():
                    log.debug(
                        "task %s assigned to %s",
                        e.task_id,
                        session.worker_id,
                        extra={
                            "task_id": e.task_id,
                            "device": device,
                            "attempt": e.attempt,
                            "worker_id": session.worker_id,
                        },
                    )
            if span is not None:
                span.set_attribute("worker.id", session.worker_id)
                span.end()

    def unplaced(self, placement: Placement) -> None:
        """Tasks no worker took: their assign spans end, saying what happened to them."""
        if not self._assigning:
            return
        for action, entries in placement.unplaced.items():
            for e in entries:
                span = self._assigning.pop(e.task_id, None)
                if span is not None:
                    span.set_attribute("assign.outcome", action)
                    span.add_event("not assigned", {"action": action})
                    span.end()

    def _drop_open(self) -> None:
        for span in self._assigning.values():
            span.set_attribute("assign.outcome", "unknown")
            span.end()
        self._assigning.clear()


__all__ = ["DispatchObserver", "task_attributes"]
