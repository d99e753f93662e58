"""The workers connected to this scheduler replica: their credits, task types and held tasks.

`place` turns popped entries into per-worker assignments (GPU workers first for OCR), spending one
credit per task; tasks no connected worker takes, or no worker has room for, come back unplaced. Each
hand-out gets a lease token signed for its worker (`sieve.redis.leases.LeaseSigner`), and `send` records it
ASSIGNED (`scheduler_svc.lifecycle`). `adopt` gives a stream a lease that a reconnecting worker re-announced
(the checks are the servicer's); `timed_out` lists hand-outs past their type's execution timeout.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sieve.db.tasks import HandOut
from sieve.enums import enum_label
from sieve.redis.entry import Entry
from sieve.redis.leases import LeaseSigner, new_token
from sieve.v1 import scheduler_pb2
from sieve.v1.types_pb2 import TaskType

if TYPE_CHECKING:
    from scheduler_svc.lifecycle import LifecycleWriter
    from scheduler_svc.routing import Route


@dataclass(frozen=True, slots=True)
class Handed:
    """When and what a stream was handed: for execution timeouts and retry delays."""

    #: time.monotonic() of the hand-out (of the adoption's claimed assignment time, for an adopted lease)
    at: float
    task_type: int
    #: counted failures before this hand-out (its attempt is failures + 1)
    failures: int = 0


@dataclass(slots=True)
class Claim:
    """A lease a reconnecting worker re-announced that could not be adopted yet (its holder may still be alive:
    it was renewed too recently), and the settlement that came for it meanwhile."""

    token: str
    assigned_at: float
    settlement: scheduler_pb2.Ack | scheduler_pb2.Nack | None = None


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
    #: task_id -> when and what it was handed (every held task has one)
    handed: dict[str, Handed] = field(default_factory=dict)
    #: re-announced leases waiting to be adopted (task_id -> claim)
    claims: dict[str, Claim] = field(default_factory=dict)
    #: re-announced leases that were already settled or taken back: their late acks and nacks are dropped quietly
    gone: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Placement:
    placed: dict[Session, list[Entry]]
    #: no eligible worker had a credit left, by what to do about it (see routing.Action)
    unplaced: dict[str, list[Entry]]
    #: (reason, task ids) of tasks routed in a way worth recording in their history
    notes: dict[str, list[str]]


class Board:
    """All sessions of this replica; the dispatcher waits on `changed` for credits to appear."""

    def __init__(self, *, signer: LeaseSigner | None = None, lifecycle: LifecycleWriter | None = None) -> None:
        self.sessions: set[Session] = set()
        self.changed = asyncio.Event()
        #: signs lease tokens (without it tokens are random and only this process knows them)
        self.signer = signer
        #: records hand-outs ASSIGNED in PostgreSQL (without it nothing is recorded)
        self.lifecycle = lifecycle

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
        session.handed.clear()
        session.claims.clear()
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
        session.handed.pop(task_id, None)
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
            chosen.tokens[entry.task_id] = self.token(entry.task_id, entry.attempt, chosen.worker_id)
            chosen.handed[entry.task_id] = Handed(time.monotonic(), entry.task_type, entry.failures)
            placed[chosen].append(entry)
            if r.reason:
                notes[r.reason].append(entry.task_id)
        return Placement(dict(placed), dict(unplaced), dict(notes))

    def token(self, task_id: str, lease: int, worker_id: str) -> str:
        return self.signer.sign(task_id, lease, worker_id) if self.signer is not None else new_token(lease)

    def send(self, session: Session, mac: str, entries: list[Entry]) -> None:
        """Sends placed entries to their stream in one batch, and records them ASSIGNED."""
        now = datetime.now(UTC)
        batch = scheduler_pb2.AssignmentBatch()
        for e in entries:
            a = batch.assignments.add(task_id=e.task_id, device_id=mac, type=e.task_type, priority=e.priority,
                                      attempt=e.failures + 1, lease_token=session.tokens[e.task_id],
                                      traceparent=e.trace)
            a.assigned_at.FromDatetime(now)
            a.enqueued_at.FromMilliseconds(e.enqueued_ms)
        session.outbound.put_nowait(scheduler_pb2.PullResponse(batch=batch))
        if self.lifecycle is not None:
            self.lifecycle.assigned([HandOut(uuid.UUID(e.task_id), e.attempt, e.failures + 1, session.worker_id, now)
                                     for e in entries])

    def holder(self, task_id: str) -> Session | None:
        """The session of this replica that holds `task_id`, if any."""
        return next((s for s in self.sessions if task_id in s.held), None)

    def adopt(self, session: Session, task_id: str, mac: str, lease: int, token: str, handed: Handed) -> None:
        """Gives `session` a lease its worker re-announced (checked by the caller: its token, Redis, no other
        holder)."""
        session.held[task_id] = (mac, lease)
        session.tokens[task_id] = token
        session.handed[task_id] = handed
        session.claims.pop(task_id, None)
        self.changed.set()

    def timed_out(self, timeout_s: Callable[[str], float], grace_s: float,
                  now: float | None = None) -> list[tuple[Session, str]]:
        """Hand-outs held longer than their type's execution timeout plus `grace_s`."""
        now = time.monotonic() if now is None else now
        limits: dict[int, float] = {}
        out: list[tuple[Session, str]] = []
        for session in self.sessions:
            for task_id, handed in session.handed.items():
                limit = limits.get(handed.task_type)
                if limit is None:
                    type_label = enum_label(TaskType, handed.task_type)
                    limit = limits.setdefault(handed.task_type, timeout_s(type_label) + grace_s)
                if now - handed.at > limit:
                    out.append((session, task_id))
        return out

    def claimed_task_ids(self) -> set[str]:
        """Re-announced leases this replica's streams wait to adopt."""
        return {task_id for s in self.sessions for task_id in s.claims}

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
