"""A worker's Pull stream as this replica sees it (`Session`), and every change made to one.

A session's fields are read anywhere; they are changed only by the methods here: what the worker said (its
hello, its credits, that it is still there), hand-outs (taken with a credit, adopted from a re-announcement,
released on an ack or nack or a take-back), re-announced leases waiting to be adopted (`Claim`), and the end of
the stream. The board (`scheduler_svc.board`) keeps the set of sessions and wakes the dispatcher when something
changed; the servicer decides what a message means.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sieve.v1 import scheduler_pb2

Settlement = scheduler_pb2.Ack | scheduler_pb2.Nack


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
    settlement: Settlement | None = None


@dataclass(eq=False)
class Session:
    """One worker's Pull stream: what it may run (task types, GPU), its credits and their cap, the tasks it holds
    under their lease tokens, the leases it re-announced, and the queue of messages to send it."""

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

    # --- what the worker says -------------------------------------------------------------------------
    def heard_from(self) -> None:
        """The worker said something now."""
        self.last_seen = time.monotonic()

    def announce(self, hello: scheduler_pb2.WorkerHello) -> bool:
        """A later hello on the stream: the worker's GPU mode (and task types, when given) now; True when
        something changed."""
        types = frozenset(hello.task_types) or self.task_types
        if (types, hello.gpu) == (self.task_types, self.gpu):
            return False
        self.task_types, self.gpu = types, hello.gpu
        return True

    def cap_credits(self, cap: int) -> None:
        """The most tasks the worker may hold at once (0: none until it registers)."""
        self.credit_cap = cap

    def add_credits(self, count: int) -> int:
        """Adds credits up to the cap (held tasks and unused credits count against it); returns how many were
        taken."""
        room = max(0, self.credit_cap - len(self.held) - self.credits)
        taken = min(count, room)
        self.credits += taken
        return taken

    def drop_credits(self) -> None:
        self.credits = 0

    # --- hand-outs ------------------------------------------------------------------------------------
    def take(self, task_id: str, mac: str, lease: int, token: str, handed: Handed) -> None:
        """A task handed to this stream, for one of its credits."""
        self.credits -= 1
        self.held[task_id] = (mac, lease)
        self.tokens[task_id] = token
        self.handed[task_id] = handed

    def adopt(self, task_id: str, mac: str, lease: int, token: str, handed: Handed) -> None:
        """A lease the worker re-announced, now held by this stream (no credit spent: it was handed out before)."""
        self.held[task_id] = (mac, lease)
        self.tokens[task_id] = token
        self.handed[task_id] = handed
        self.claims.pop(task_id, None)

    def holds(self, task_id: str, token: str) -> bool:
        """True when `task_id` is held by this stream under exactly this lease token."""
        held = self.tokens.get(task_id)
        return held is not None and hmac.compare_digest(held, token)

    def release(self, task_id: str) -> tuple[str, int] | None:
        """Takes one held task off the stream (its device and attempt), or None when it holds no such task."""
        self.tokens.pop(task_id, None)
        self.handed.pop(task_id, None)
        return self.held.pop(task_id, None)

    # --- leases re-announced by a reconnecting worker ---------------------------------------------------
    def claim(self, task_id: str, token: str, assigned_at: float) -> None:
        """A re-announced lease to look at (and adopt when it checks out)."""
        self.claims[task_id] = Claim(token, assigned_at)

    def keep_settlement(self, settlement: Settlement) -> None:
        """An ack or nack for a claim not adopted yet: settled once it is."""
        self.claims[settlement.task_id].settlement = settlement

    def drop_claim(self, task_id: str, *, gone: bool = False) -> None:
        """Stops looking at a claim; `gone`: its lease was settled or taken back already (a late ack or nack of it
        is dropped quietly)."""
        self.claims.pop(task_id)
        if gone:
            self.gone.add(task_id)

    # --- the stream -----------------------------------------------------------------------------------
    def send(self, message: scheduler_pb2.PullResponse) -> None:
        self.outbound.put_nowait(message)

    def end_stream(self) -> None:
        """Tells the stream's sender to stop (after what is queued)."""
        self.outbound.put_nowait(None)

    def close(self) -> dict[str, list[tuple[str, int]]]:
        """Ends the session: it holds nothing any more and its stream stops; returns what it held, by device."""
        self.closed = True
        held: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for task_id, (mac, attempt) in self.held.items():
            held[mac].append((task_id, attempt))
        self.held.clear()
        self.tokens.clear()
        self.handed.clear()
        self.claims.clear()
        self.end_stream()
        return dict(held)


__all__ = ["Claim", "Handed", "Session", "Settlement"]
