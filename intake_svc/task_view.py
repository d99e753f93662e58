"""Turns task and result rows from PostgreSQL into `sieve.v1.Task` messages.

`attempt_log` reads a task's attempts off its history (sieve/db/tasks.py): entries about a hand-out carry its
lease number, so ASSIGNED, RUNNING and how it ended (SUCCEEDED / FAILED, put back PENDING with the reason,
DEAD_LETTERED ...) are grouped by lease. Entries written before leases were recorded in the history are read
in order: an ASSIGNED opens an attempt, the RUNNING right after it and the next final status belong to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
from google.protobuf import timestamp_pb2

from sieve.db.tasks import NewTask, status_value, type_value
from sieve.v1 import types_pb2


def _ts(value: datetime | str | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def _verdict(name: str) -> int:
    return types_pb2.Verdict.Value("VERDICT_" + name)


def result_message(result: asyncpg.Record) -> types_pb2.DetectionResult:
    hits: list[dict[str, Any]] = result["hits"]
    return types_pb2.DetectionResult(
        verdict=_verdict(result["verdict"]),
        hits=[types_pb2.Hit(word=h["word"], category=h["category"], severity=h["severity"], start=h["start"],
                            end=h["end"], matched_text=h["matched_text"]) for h in hits],
        text=result["text"],
        worker_id=result["worker_id"],
        created_at=_ts(result["created_at"]),
    )


def new_task_message(task: NewTask, stamps: dict[datetime, timestamp_pb2.Timestamp] | None = None
                     ) -> types_pb2.Task:
    """The message of a task just accepted, built from what was recorded (no read back).

    `stamps` caches converted times across one batch, whose tasks share their creation (and mostly their
    expiry) time."""
    stamps = {} if stamps is None else stamps
    created = stamps.get(task.created_at) or stamps.setdefault(task.created_at, _ts(task.created_at))
    expires = stamps.get(task.expires_at) or stamps.setdefault(task.expires_at, _ts(task.expires_at))
    return types_pb2.Task(
        task_id=str(task.task_id), device_id=task.device, type=task.task_type, priority=task.priority,
        status=types_pb2.TASK_STATUS_PENDING, attempts=0, created_at=created, updated_at=created,
        expires_at=expires,
        history=[types_pb2.StatusChange(status=types_pb2.TASK_STATUS_PENDING, at=created,
                                        detail=f"accepted from {task.caller}")],
        idempotency_key=task.idempotency_key or "",
        max_attempts=task.max_attempts or 0,
    )


_FINAL = ("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED", "DEAD_LETTERED")


def _set_ts(target: timestamp_pb2.Timestamp, value: datetime | str | None) -> None:
    ts = _ts(value)
    if ts is not None:
        target.CopyFrom(ts)


def attempt_log(history: list[dict[str, Any]]) -> list[types_pb2.TaskAttempt]:
    """Every hand-out of a task, oldest first, from its history (see the module)."""
    attempts: list[types_pb2.TaskAttempt] = []
    by_lease: dict[int, types_pb2.TaskAttempt] = {}
    ended: set[int] = set()  # indexes (in `attempts`) of the attempts that have an outcome
    legacy: int | None = None  # index of the open attempt of lease-less entries
    previous = ""

    def opened(lease: int, h: dict[str, Any]) -> int:
        if lease not in by_lease:
            by_lease[lease] = types_pb2.TaskAttempt(lease=lease, attempt=int(h.get("attempt") or 0))
            attempts.append(by_lease[lease])
        return next(i for i, a in enumerate(attempts) if a is by_lease[lease])

    def close(i: int, status: str, h: dict[str, Any]) -> None:
        if i in ended:
            return
        ended.add(i)
        a = attempts[i]
        a.outcome = status_value(status)
        _set_ts(a.ended_at, h.get("at"))
        a.detail = str(h.get("detail") or "")

    for h in history:
        status = str(h.get("status", ""))
        lease = h.get("lease")
        leased = isinstance(lease, int) and lease > 0
        if leased and status in ("ASSIGNED", "RUNNING"):
            a = attempts[opened(lease, h)]
            a.attempt = int(h.get("attempt") or a.attempt)
            a.worker_id = str(h.get("worker") or h.get("detail") or a.worker_id)
            _set_ts(a.assigned_at if status == "ASSIGNED" else a.started_at, h.get("at"))
        elif leased and status == "PENDING" and "counted" in h:  # a put-back
            i = opened(lease, h)
            if h.get("worker") and not attempts[i].worker_id:
                attempts[i].worker_id = str(h["worker"])
            if i not in ended:
                close(i, "PENDING", h)
                attempts[i].counted = bool(h.get("counted"))
                _set_ts(attempts[i].retry_at, h.get("retry_at"))
        elif leased and status in _FINAL:
            if lease in by_lease:
                close(opened(lease, h), status, h)
        elif not leased and status == "ASSIGNED":  # written before leases were in the history
            attempts.append(types_pb2.TaskAttempt(attempt=int(h.get("attempt") or 0),
                                                  worker_id=str(h.get("detail") or "")))
            legacy = len(attempts) - 1
            _set_ts(attempts[legacy].assigned_at, h.get("at"))
        elif not leased and status == "RUNNING" and previous == "ASSIGNED" and legacy is not None:
            _set_ts(attempts[legacy].started_at, h.get("at"))
        elif not leased and status in _FINAL and legacy is not None:
            close(legacy, status, h)
        previous = "" if leased else status
    return attempts


def _get(row: asyncpg.Record, column: str) -> Any:
    try:
        return row[column]
    except KeyError:
        return None


def task_message(row: asyncpg.Record, result: asyncpg.Record | None = None) -> types_pb2.Task:
    history = [
        types_pb2.StatusChange(status=status_value(h["status"]), at=_ts(h["at"]), attempt=h.get("attempt", 0),
                               detail=h.get("detail") or "")
        for h in row["history"]
    ]
    task = types_pb2.Task(
        task_id=str(row["id"]),
        device_id=row["device"],
        type=type_value(row["type"]),
        priority=row["priority"],
        status=status_value(row["status"]),
        attempts=row["attempts"],
        created_at=_ts(row["created_at"]),
        updated_at=_ts(row["updated_at"]),
        expires_at=_ts(row["expires_at"]),
        history=history,
        error=row["error"] or "",
        idempotency_key=row["idempotency_key"] or "",
        attempt_log=attempt_log(row["history"]),
        max_attempts=_get(row, "max_attempts") or 0,
    )
    if result is not None:
        task.result.CopyFrom(result_message(result))
    return task
