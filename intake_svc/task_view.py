"""Turns task and result rows from PostgreSQL into `sieve.v1.Task` messages."""

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
    )


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
    )
    if result is not None:
        task.result.CopyFrom(result_message(result))
    return task
