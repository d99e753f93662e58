"""Queue entries: the scheduling data of one task as it sits in a device queue or a lease.

An entry is the string `task_id|type|prio|enqueued_ms|expires_ms|attempt|defers|failures|trace[|caller]`; the
Lua scripts parse the same layout (`lua/includes/parseEntry.lua`). The payload never enters Redis; `trace` is
the W3C traceparent of the Submit that created the task (empty when not traced), so that the scheduler and
the worker continue its trace. `caller` is the principal that submitted the task, last so that a name may
hold any character, and left out when empty (entries queued before callers were recorded): the scripts
count each caller's open tasks by it (`Keys.caller_open`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Entry:
    """One task as a queue or a lease holds it (no payload): encode / decode the string form."""

    task_id: str
    task_type: int
    priority: int
    enqueued_ms: int
    expires_ms: int
    #: Hand-outs so far; never goes down, so the attempt number of a lease is its fencing token.
    attempt: int = 0
    #: Times the task was put back because no worker could take it.
    defers: int = 0
    #: Attempts that failed and count towards dead-lettering (max_attempts).
    failures: int = 0
    #: W3C traceparent of the Submit span ("" when none).
    trace: str = ""
    #: Name of the principal that submitted the task ("" when unknown: not counted per caller).
    caller: str = ""

    def encode(self) -> str:
        text = (
            f"{self.task_id}|{self.task_type}|{self.priority}|{self.enqueued_ms}|{self.expires_ms}"
            f"|{self.attempt}|{self.defers}|{self.failures}|{self.trace}"
        )
        return f"{text}|{self.caller}" if self.caller else text

    @classmethod
    def decode(cls, raw: str | bytes) -> Entry:
        text = raw.decode() if isinstance(raw, bytes) else raw
        task_id, task_type, priority, enqueued, expires, attempt, defers, failures, trace, *caller = text.split("|", 9)
        return cls(
            task_id,
            int(task_type),
            int(priority),
            int(enqueued),
            int(expires),
            int(attempt),
            int(defers),
            int(failures),
            trace,
            caller[0] if caller else "",
        )

    def with_attempt(self, attempt: int) -> Entry:
        return replace(self, attempt=attempt)
