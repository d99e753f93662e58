"""Turns task, result and callback delivery rows from PostgreSQL into `sieve.v1.Task` messages.

`attempt_log` reads a task's attempts off its history (sieve/db/tasks.py): entries about a hand-out carry its
lease number, so ASSIGNED, RUNNING and how it ended (SUCCEEDED / FAILED, put back PENDING with the reason,
DEAD_LETTERED ...) are grouped by lease. Entries written before leases were recorded in the history are read
in order: an ASSIGNED opens an attempt, the RUNNING right after it and the next final status belong to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
from google.protobuf import timestamp_pb2

from intake_svc.result_view import result_message, timestamp, timestamp_of
from sieve.db.tasks import NewTask, status_value, type_value
from sieve.enums import enum_value
from sieve.v1 import types_pb2


def _status(name: str) -> types_pb2.TaskStatus:
    return enum_value(types_pb2.TaskStatus, status_value(name))


#: what the messages of one batch's new tasks share, by (created, expires, caller): status, times and history
NewTaskTemplates = dict[tuple[datetime, datetime, str], types_pb2.Task]


def new_task_message(task: NewTask) -> types_pb2.Task:
    """The message of a task just accepted, built from what was recorded (no read back)."""
    message = types_pb2.Task()
    fill_new_task(message, task, {})
    return message


def fill_new_task(message: types_pb2.Task, task: NewTask, templates: NewTaskTemplates) -> None:
    """Fills the empty `message` as `new_task_message` builds it. `templates` caches, across one batch, the part
    its tasks share (they are created at one time, by one caller, mostly with one expiry): one copy at C speed and a
    few fields per task, not a message built field by field."""
    key = (task.created_at, task.expires_at, task.caller)
    template = templates.get(key)
    if template is None:
        created = timestamp(task.created_at)
        template = templates[key] = types_pb2.Task(
            status=types_pb2.TASK_STATUS_PENDING,
            attempts=0,
            created_at=created,
            updated_at=created,
            expires_at=timestamp(task.expires_at),
            history=[
                types_pb2.StatusChange(
                    status=types_pb2.TASK_STATUS_PENDING, at=created, detail=f"accepted from {task.caller}"
                )
            ],
        )
    message.CopyFrom(template)
    message.task_id = str(task.task_id)
    message.device_id = task.device
    message.type = enum_value(types_pb2.TaskType, task.task_type)
    message.priority = enum_value(types_pb2.Priority, task.priority)
    if task.idempotency_key:
        message.idempotency_key = task.idempotency_key
    if task.max_attempts:
        message.max_attempts = task.max_attempts
    if task.labels:
        message.labels.update(task.labels)
    if task.callback_url:
        message.callback_url = task.callback_url


_FINAL = ("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED", "DEAD_LETTERED")


def _settimestamp_of(target: timestamp_pb2.Timestamp, value: datetime | str | None) -> None:
    ts = timestamp_of(value)
    if ts is not None:
        target.CopyFrom(ts)


def attempt_log(history: list[dict[str, Any]]) -> list[types_pb2.TaskAttempt]:
    """Every hand-out of a task, oldest first, from its history (see the module)."""
    reading = _AttemptLog()
    for h in history:
        reading.read(h)
    return reading.attempts


class _AttemptLog:
    """The attempts read so far from one task's history, and where the reading is."""

    def __init__(self) -> None:
        self.attempts: list[types_pb2.TaskAttempt] = []
        self.by_lease: dict[int, types_pb2.TaskAttempt] = {}
        #: indexes (in `attempts`) of the attempts that have an outcome
        self.ended: set[int] = set()
        #: index of the open attempt of lease-less entries
        self.legacy: int | None = None
        #: the status of the previous entry when it had no lease ("" after a leased one)
        self.previous = ""

    def read(self, h: dict[str, Any]) -> None:
        """One history entry, in order."""
        status = str(h.get("status", ""))
        lease = h.get("lease")
        if isinstance(lease, int) and lease > 0:
            self._leased(lease, status, h)
            self.previous = ""
        else:
            self._lease_less(status, h)
            self.previous = status

    def _leased(self, lease: int, status: str, h: dict[str, Any]) -> None:
        """An entry about hand-out `lease`: it opens, starts, puts back or ends that attempt."""
        if status in ("ASSIGNED", "RUNNING"):
            a = self.attempts[self._opened(lease, h)]
            a.attempt = int(h.get("attempt") or a.attempt)
            a.worker_id = str(h.get("worker") or h.get("detail") or a.worker_id)
            _settimestamp_of(a.assigned_at if status == "ASSIGNED" else a.started_at, h.get("at"))
        elif status == "PENDING" and "counted" in h:  # a put-back
            i = self._opened(lease, h)
            if h.get("worker") and not self.attempts[i].worker_id:
                self.attempts[i].worker_id = str(h["worker"])
            if i not in self.ended:
                self._close(i, "PENDING", h)
                self.attempts[i].counted = bool(h.get("counted"))
                _settimestamp_of(self.attempts[i].retry_at, h.get("retry_at"))
        elif status in _FINAL and lease in self.by_lease:
            self._close(self._opened(lease, h), status, h)

    def _lease_less(self, status: str, h: dict[str, Any]) -> None:
        """An entry written before leases were in the history: an ASSIGNED opens an attempt, the RUNNING right
        after it and the next final status belong to it."""
        if status == "ASSIGNED":
            self.attempts.append(
                types_pb2.TaskAttempt(attempt=int(h.get("attempt") or 0), worker_id=str(h.get("detail") or ""))
            )
            self.legacy = len(self.attempts) - 1
            _settimestamp_of(self.attempts[self.legacy].assigned_at, h.get("at"))
        elif status == "RUNNING" and self.previous == "ASSIGNED" and self.legacy is not None:
            _settimestamp_of(self.attempts[self.legacy].started_at, h.get("at"))
        elif status in _FINAL and self.legacy is not None:
            self._close(self.legacy, status, h)

    def _opened(self, lease: int, h: dict[str, Any]) -> int:
        """The index of the attempt of `lease`, opened (with the entry's attempt number) if it was not yet."""
        if lease not in self.by_lease:
            self.by_lease[lease] = types_pb2.TaskAttempt(lease=lease, attempt=int(h.get("attempt") or 0))
            self.attempts.append(self.by_lease[lease])
        return next(i for i, a in enumerate(self.attempts) if a is self.by_lease[lease])

    def _close(self, i: int, status: str, h: dict[str, Any]) -> None:
        """Attempt `i` ended as `status` (its first outcome counts)."""
        if i in self.ended:
            return
        self.ended.add(i)
        a = self.attempts[i]
        a.outcome = _status(status)
        _settimestamp_of(a.ended_at, h.get("at"))
        a.detail = str(h.get("detail") or "")


def _get(row: asyncpg.Record, column: str) -> Any:
    try:
        return row[column]
    except KeyError:
        return None


def _labels(value: Any) -> dict[str, str]:
    if isinstance(value, str):  # a connection without the jsonb codec
        value = json.loads(value)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def task_message(
    row: asyncpg.Record, result: asyncpg.Record | None = None, deliveries: Sequence[asyncpg.Record] = ()
) -> types_pb2.Task:
    history = [
        types_pb2.StatusChange(
            status=_status(h["status"]),
            at=timestamp_of(h["at"]),
            attempt=h.get("attempt", 0),
            detail=h.get("detail") or "",
        )
        for h in row["history"]
    ]
    task = types_pb2.Task(
        task_id=str(row["id"]),
        device_id=row["device"],
        type=enum_value(types_pb2.TaskType, type_value(row["type"])),
        priority=row["priority"],
        status=_status(row["status"]),
        attempts=row["attempts"],
        created_at=timestamp_of(row["created_at"]),
        updated_at=timestamp_of(row["updated_at"]),
        expires_at=timestamp_of(row["expires_at"]),
        history=history,
        error=row["error"] or "",
        idempotency_key=row["idempotency_key"] or "",
        attempt_log=attempt_log(row["history"]),
        max_attempts=_get(row, "max_attempts") or 0,
        labels=_labels(_get(row, "labels")),
        callback_url=_get(row, "callback_url") or "",
        deliveries=[delivery_message(d) for d in deliveries],
    )
    if result is not None:
        task.result.CopyFrom(result_message(result))
    return task


_DELIVERY_STATES = {
    "PENDING": types_pb2.CallbackDelivery.STATE_PENDING,
    "DELIVERED": types_pb2.CallbackDelivery.STATE_DELIVERED,
    "GAVE_UP": types_pb2.CallbackDelivery.STATE_GAVE_UP,
}


def delivery_message(row: asyncpg.Record) -> types_pb2.CallbackDelivery:
    """A callback_deliveries row (sieve/db/callbacks.py) as the API shows it."""
    message = types_pb2.CallbackDelivery(
        url=row["url"],
        state=_DELIVERY_STATES.get(row["state"], types_pb2.CallbackDelivery.STATE_UNSPECIFIED),
        status=_status(row["status"]),
        attempts=row["attempts"],
        last_http_status=row["last_http_status"] or 0,
        last_error=row["last_error"] or "",
        created_at=timestamp_of(row["created_at"]),
        delivery_id=f"{row['task_id']}/{row['seq']}",
    )
    if row["state"] == "PENDING":
        message.next_attempt_at.CopyFrom(timestamp(row["next_at"]))
    if row["delivered_at"] is not None:
        message.delivered_at.CopyFrom(timestamp(row["delivered_at"]))
    return message
