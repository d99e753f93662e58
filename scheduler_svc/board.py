"""The workers connected to this scheduler replica: their credits, task types and held tasks.

`place` turns popped entries into per-worker assignments (GPU workers first for OCR), spending one
credit per task; tasks no connected worker takes, or no worker has room for, come back unplaced.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sieve.entry import Entry
from sieve.lease import new_token
from sieve.v1 import scheduler_pb2

if TYPE_CHECKING:
    from scheduler_svc.routing import Route


@dataclass(eq=False)
class Session:
    """One worker's Pull stream."""

    worker_id: str
    task_types: frozenset[int]
    gpu: bool
    credits: int = 0
    #: task_id -> (device, attempt) of every task handed to this worker and not yet acked or nacked
    held: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: task_id -> the lease token of its hand-out to this stream (only these can be acked or nacked here)
    tokens: dict[str, str] = field(default_factory=dict)
    #: the most tasks this worker may hold at once (its registered concurrency); credits beyond it are ignored
    credit_cap: int = 0
    #: opened by the anonymous principal (SIEVE_ALLOW_ANONYMOUS): may pull without registering
    anonymous: bool = False
    outbound: asyncio.Queue[scheduler_pb2.PullResponse | None] = field(default_factory=asyncio.Queue)
    closed: bool = False
    #: when the worker last said anything (monotonic s): its leases are renewed only while it talks
    last_seen: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class Placement:
    placed: dict[Session, list[Entry]]
    #: no eligible worker had a credit left, by what to do about it (see routing.Action)
    unplaced: dict[str, list[Entry]]
    #: (reason, task ids) of tasks routed in a way worth recording in their history
    notes: dict[str, list[str]]


class Board:
    """All sessions of this replica; the dispatcher waits on `changed` for credits to appear."""

    def __init__(self) -> None:
        self.sessions: set[Session] = set()
        self.changed = asyncio.Event()

    def open(self, hello: scheduler_pb2.WorkerHello) -> Session:
        session = Session(hello.worker_id, frozenset(hello.task_types), hello.gpu)
        self.sessions.add(session)
        self.changed.set()
        return session

    def update(self, session: Session, hello: scheduler_pb2.WorkerHello) -> bool:
        """A later hello on the stream: the worker's GPU mode (and task types, when given) now; True when
        something changed."""
        types = frozenset(hello.task_types) or session.task_types
        if (types, hello.gpu) == (session.task_types, session.gpu):
            return False
        session.task_types, session.gpu = types, hello.gpu
        self.changed.set()
        return True

    def close(self, session: Session) -> dict[str, list[tuple[str, int]]]:
        """Removes a session; returns what it still held, grouped by device."""
        session.closed = True
        self.sessions.discard(session)
        held: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for task_id, (mac, attempt) in session.held.items():
            held[mac].append((task_id, attempt))
        session.held.clear()
        session.tokens.clear()
        session.outbound.put_nowait(None)
        self.changed.set()
        return dict(held)

    def add_credits(self, session: Session, count: int) -> int:
        """Adds credits up to the session's cap (held tasks and unused credits count against it); returns how
        many were taken."""
        room = max(0, session.credit_cap - len(session.held) - session.credits)
        taken = min(count, room)
        session.credits += taken
        if taken > 0:
            self.changed.set()
        return taken

    def drop_credits(self, session: Session) -> None:
        session.credits = 0

    def holds(self, session: Session, task_id: str, token: str) -> bool:
        """True when `task_id` is held by this stream under exactly this lease token."""
        held = session.tokens.get(task_id)
        return held is not None and hmac.compare_digest(held, token)

    def release(self, session: Session, task_id: str) -> tuple[str, int] | None:
        """Takes one held task off the session (its device and attempt), or None when it holds no such task."""
        session.tokens.pop(task_id, None)
        return session.held.pop(task_id, None)

    @property
    def credits(self) -> int:
        return sum(s.credits for s in self.sessions)

    def takers(self, task_type: int) -> list[Session]:
        return [s for s in self.sessions if task_type in s.task_types]

    def place(self, mac: str, entries: list[Entry], route: Callable[[int], Route]) -> Placement:
        """Spends one credit of an eligible worker per task, best worker first (GPU first for OCR, then
        the one with the most room)."""
        placed: dict[Session, list[Entry]] = defaultdict(list)
        unplaced: dict[str, list[Entry]] = defaultdict(list)
        notes: dict[str, list[str]] = defaultdict(list)
        routes: dict[int, Route] = {}
        for entry in entries:
            r = routes.get(entry.task_type) or routes.setdefault(entry.task_type, route(entry.task_type))
            chosen = next((s for s in r.sessions if s.credits > 0 and not s.closed), None)
            if chosen is None:
                unplaced[r.otherwise.value].append(entry)
                continue
            chosen.credits -= 1
            chosen.held[entry.task_id] = (mac, entry.attempt)
            chosen.tokens[entry.task_id] = new_token(entry.attempt)
            placed[chosen].append(entry)
            if r.reason:
                notes[r.reason].append(entry.task_id)
        return Placement(dict(placed), dict(unplaced), dict(notes))

    @staticmethod
    def send(session: Session, mac: str, entries: list[Entry]) -> None:
        now = datetime.now(UTC)
        batch = scheduler_pb2.AssignmentBatch()
        for e in entries:
            a = batch.assignments.add(task_id=e.task_id, device_id=mac, type=e.task_type, priority=e.priority,
                                      attempt=e.failures + 1, lease_token=session.tokens[e.task_id],
                                      traceparent=e.trace)
            a.assigned_at.FromDatetime(now)
            a.enqueued_at.FromMilliseconds(e.enqueued_ms)
        session.outbound.put_nowait(scheduler_pb2.PullResponse(batch=batch))

    def forget(self, session: Session, task_ids: list[str]) -> None:
        for task_id in task_ids:
            self.release(session, task_id)
        self.changed.set()

    async def all_acked(self) -> None:
        """Returns once no session holds a task."""
        while self.held_task_ids():
            self.changed.clear()
            await self.changed.wait()

    def live_held_task_ids(self, within_s: float) -> list[str]:
        """Tasks held by workers heard from within `within_s` (a frozen worker's leases run out)."""
        now = time.monotonic()
        return [task_id for s in self.sessions if now - s.last_seen < within_s for task_id in s.held]

    def held_task_ids(self) -> list[str]:
        return [task_id for s in self.sessions for task_id in s.held]
