"""The workers connected to this scheduler replica: their sessions (`scheduler_svc.sessions`), credits, task types
and held tasks.

`place` turns popped entries into per-worker assignments (GPU workers first for OCR), spending one
credit per task; tasks no connected worker takes, or no worker has room for, come back unplaced. Each
hand-out gets a lease token signed for its worker (`sieve.redis.leases.LeaseSigner`), and `send` records it
ASSIGNED (`scheduler_svc.lifecycle`). `adopt` gives a stream a lease that a reconnecting worker re-announced
(the checks are the servicer's); `timed_out` lists hand-outs past their type's execution timeout.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduler_svc.lifecycle import LifecycleWriter
from scheduler_svc.routing import Route
from scheduler_svc.sessions import Handed, Session
from sieve.db.tasks import HandOut
from sieve.enums import enum_label
from sieve.redis.entry import Entry
from sieve.redis.leases import LeaseSigner, new_token
from sieve.v1 import scheduler_pb2
from sieve.v1.types_pb2 import TaskType


@dataclass(frozen=True, slots=True)
class Placement:
    """Where popped entries went: to which sessions, and those no session took (by what to do about them)."""

    placed: dict[Session, list[Entry]]
    #: no eligible worker had a credit left, by what to do about it (see routing.Action)
    unplaced: dict[str, list[Entry]]
    #: (reason, task ids) of tasks routed in a way worth recording in their history
    notes: dict[str, list[str]]


class Board:
    """All sessions of this replica, and the event (`changed`) the dispatcher waits on for credits to appear; it
    places popped tasks on sessions, signs their lease tokens and sends them (see the module)."""

    def __init__(self, *, signer: LeaseSigner | None = None, lifecycle: LifecycleWriter | None = None) -> None:
        self.sessions: set[Session] = set()
        self.changed = asyncio.Event()
        #: signs lease tokens (without it tokens are random and only this process knows them)
        self.signer = signer
        #: records hand-outs ASSIGNED in PostgreSQL (without it nothing is recorded)
        self.lifecycle = lifecycle

    def open(self, hello: scheduler_pb2.WorkerHello, *, anonymous: bool = False) -> Session:
        """A new stream's session; `anonymous`: opened by the anonymous principal."""
        session = Session(hello.worker_id, frozenset(hello.task_types), hello.gpu, anonymous=anonymous)
        self.sessions.add(session)
        self.changed.set()
        return session

    def update(self, session: Session, hello: scheduler_pb2.WorkerHello) -> bool:
        """A later hello on the stream: the worker's GPU mode (and task types, when given) now; True when
        something changed."""
        if not session.announce(hello):
            return False
        self.changed.set()
        return True

    def close(self, session: Session) -> dict[str, list[tuple[str, int]]]:
        """Removes a session; returns what it still held, grouped by device."""
        held = session.close()
        self.sessions.discard(session)
        self.changed.set()
        return held

    def add_credits(self, session: Session, count: int) -> int:
        """Adds credits up to the session's cap (held tasks and unused credits count against it); returns how
        many were taken."""
        taken = session.add_credits(count)
        if taken > 0:
            self.changed.set()
        return taken

    def drop_credits(self, session: Session) -> None:
        session.drop_credits()

    def holds(self, session: Session, task_id: str, token: str) -> bool:
        """True when `task_id` is held by this stream under exactly this lease token."""
        return session.holds(task_id, token)

    def release(self, session: Session, task_id: str) -> tuple[str, int] | None:
        """Takes one held task off the session (its device and attempt), or None when it holds no such task."""
        return session.release(task_id)

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
            chosen.take(
                entry.task_id,
                mac,
                entry.attempt,
                self.token(entry.task_id, entry.attempt, chosen.worker_id),
                Handed(time.monotonic(), entry.task_type, entry.failures),
            )
            placed[chosen].append(entry)
            if r.reason:
                notes[r.reason].append(entry.task_id)
        return Placement(dict(placed), dict(unplaced), dict(notes))

    def token(self, task_id: str, lease: int, worker_id: str) -> str:
        return self.signer.sign(task_id, lease, worker_id) if self.signer is not None else new_token(lease)

    def send(self, session: Session, mac: str, entries: list[Entry]) -> None:
        """Sends placed entries of one device to their stream in one batch, and records them ASSIGNED."""
        self.send_many(session, [(mac, e) for e in entries])

    def send_many(self, session: Session, items: list[tuple[str, Entry]]) -> None:
        """Sends placed (device, entry) pairs, of any number of devices, to their stream in one batch, and
        records them ASSIGNED."""
        now = datetime.now(UTC)
        batch = scheduler_pb2.AssignmentBatch()
        for mac, e in items:
            a = batch.assignments.add(
                task_id=e.task_id,
                device_id=mac,
                type=e.task_type,
                priority=e.priority,
                attempt=e.failures + 1,
                lease_token=session.tokens[e.task_id],
                traceparent=e.trace,
            )
            a.assigned_at.FromDatetime(now)
            a.enqueued_at.FromMilliseconds(e.enqueued_ms)
        session.send(scheduler_pb2.PullResponse(batch=batch))
        if self.lifecycle is not None:
            self.lifecycle.assigned(
                [HandOut(uuid.UUID(e.task_id), e.attempt, e.failures + 1, session.worker_id, now) for _, e in items]
            )

    def holder(self, task_id: str) -> Session | None:
        """The session of this replica that holds `task_id`, if any."""
        return next((s for s in self.sessions if task_id in s.held), None)

    def adopt(self, session: Session, task_id: str, mac: str, lease: int, token: str, handed: Handed) -> None:
        """Gives `session` a lease its worker re-announced (checked by the caller: its token, Redis, no other
        holder)."""
        session.adopt(task_id, mac, lease, token, handed)
        self.changed.set()

    def timed_out(
        self, timeout_s: Callable[[str], float], grace_s: float, now: float | None = None
    ) -> list[tuple[Session, str]]:
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
        """Held tasks that were settled (acked) leave the session."""
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
