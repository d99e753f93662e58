"""Operators' view of dead letters: list, requeue (one, by filter, all) and purge.

The capped Redis list (`sieve.redis.dead_letter_store`) is the operators' working view: recent dead letters,
with their errors, cheap to list and filter; PostgreSQL keeps every task's status for good. A requeued task keeps
its id and history: its row goes back to PENDING (fresh attempts) and it joins its device queue again, past the
admission limits (an operator asked for it).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from sieve.db.tasks import TaskStore, type_value
from sieve.errors import InvalidInput
from sieve.fields import parse_uuid, shown, text_problem
from sieve.mac import normalize_mac
from sieve.redis.dead_letter_store import DeadLetter, DeadLetterStore
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.v1 import scheduler_pb2, types_pb2

log = logging.getLogger("sieve.scheduler.dead_letters")

MAX_LIST = 1000
#: longest error text a filter may look for (stored errors are capped shorter)
MAX_ERROR_FILTER = 1000
#: longest device id a filter may name (a MAC address in its longest spelling, with blanks around)
MAX_MAC_CHARS = 64


@dataclass(frozen=True, slots=True)
class Filter:
    """Which dead letters an operator's request acts on: every field given must match (empty: all of them)."""

    task_id: str = ""
    device: str = ""
    task_type: int = 0
    error_contains: str = ""

    @classmethod
    def from_proto(cls, f: scheduler_pb2.DeadLetterFilter) -> Filter:
        """The filter of a request, or InvalidInput naming the bad field: the task id a UUID (compared in its
        canonical spelling), the device a MAC address, the type a known one, the error text at most
        MAX_ERROR_FILTER characters without U+0000."""
        device = ""
        if f.device_id:
            if len(f.device_id) > MAX_MAC_CHARS:
                raise InvalidInput("filter.device_id", f"{shown(f.device_id)} is not a MAC address (too long)")
            try:
                device = normalize_mac(f.device_id)
            except ValueError:
                raise InvalidInput("filter.device_id", f"{shown(f.device_id)} is not a MAC address") from None
        task_id = str(parse_uuid(f.task_id, "filter.task_id")) if f.task_id else ""
        if f.type and f.type not in (types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE):
            raise InvalidInput("filter.type", f"unknown task type {f.type}")
        problem = text_problem(f.error_contains, max_chars=MAX_ERROR_FILTER)
        if problem is not None:
            raise InvalidInput("filter.error_contains", problem)
        return cls(task_id, device, f.type, f.error_contains)

    @property
    def empty(self) -> bool:
        return not (self.task_id or self.device or self.task_type or self.error_contains)

    def matches(self, record: dict[str, Any]) -> bool:
        return (
            (not self.task_id or record["task_id"] == self.task_id)
            and (not self.device or record["device"] == self.device)
            and (not self.task_type or record["task_type"] == self.task_type)
            and (not self.error_contains or self.error_contains in record.get("error", ""))
        )


def to_proto(record: dict[str, Any]) -> scheduler_pb2.DeadLetter:
    letter = scheduler_pb2.DeadLetter(
        task_id=record["task_id"],
        device_id=record["device"],
        type=record["task_type"],
        priority=record["priority"],
        error=record.get("error", ""),
        attempts=record.get("attempts", 0),
        requeue_count=record.get("requeue_count", 0),
    )
    letter.enqueued_at.FromMilliseconds(int(record.get("enqueued_ms", 0)))
    letter.dead_at.FromMilliseconds(int(record.get("dead_ms", 0)))
    return letter


class DeadLetters:
    """The operators' dead-letter actions: list by filter, requeue (PostgreSQL row revived, task queued again,
    its dead letter removed) and purge."""

    def __init__(self, queues: QueueStore, tasks: TaskStore) -> None:
        self.letters = DeadLetterStore(queues)
        self.queues = queues
        self.tasks = tasks

    async def _matching(self, flt: Filter) -> list[DeadLetter]:
        return [(raw, rec) for raw, rec in await self.letters.all() if flt.matches(rec)]

    async def page(self, flt: Filter, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The first `limit` (default 100, at most MAX_LIST) matching dead letters, newest first, and how many dead
        letters there are in all."""
        limit = min(limit or 100, MAX_LIST)
        total = await self.letters.count()
        return [rec for _, rec in await self._matching(flt)][:limit], total

    async def requeue(self, flt: Filter) -> list[str]:
        """Requeues the matching dead letters (an empty filter: all of them)."""
        matching = await self._matching(flt)
        if not matching:
            return []
        ids = list(dict.fromkeys(uuid.UUID(rec["task_id"]) for _, rec in matching))
        revived = await self.tasks.revive(
            ids, "requeued from the dead letters by an operator", self.queues.settings.task_ttl_s
        )
        now = now_ms()
        groups: dict[str, list[Entry]] = {}
        for row in revived:
            groups.setdefault(row["device"], []).append(
                Entry(
                    str(row["id"]),
                    type_value(row["type"]),
                    row["priority"],
                    int(now),
                    int(row["expires_at"].timestamp() * 1000),
                    attempt=row["lease"],
                    caller=row["caller"],
                )
            )
        if groups:
            await self.queues.enqueue_many(groups, now=now, admit=False)
        await self.letters.remove([raw for raw, _ in matching])
        log.info("requeued %d dead letters", len(revived))
        return [str(row["id"]) for row in revived]

    async def purge(self, flt: Filter) -> int:
        """Forgets the matching dead letters (an empty filter: all of them)."""
        if flt.empty:
            return await self.letters.clear()
        return await self.letters.remove([raw for raw, _ in await self._matching(flt)])
