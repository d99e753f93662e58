"""An in-memory stand-in for the scheduler's Redis stores, for unit tests of the board, routing and dispatcher.

`FakeStore` keeps the same state the Lua scripts keep — per-device queues by priority, the device's dispatch lock
and state (ready / serving / idle), leases, the delayed set, dead letters — in plain dicts and lists, and implements
the `QueueStore` methods the dispatcher calls (`rank`, `claim`, `pop`, `release`, `requeue`,
`defer_types`, `resume_due`, `publish_drain`) plus what routing and the dispatcher ask of `SchedulerState`
(`mark_gpu_expected`, `gpu_expected`, `wake_ups`) with the scripts' semantics, simplified where a unit test does not
look: a device's queues are popped highest priority first (no aging of head tasks), ranking is by priority tier,
then by min(wait, aging_max_wait_s) x weight (one caller group: no first level). Time is a settable clock (`now`,
ms; the real time when the store was made, as the dispatcher passes the real time to the pops it makes).

`FakeOutcomes` records what the dispatcher reports (expired, dead-lettered, noted) instead of writing PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any

from sieve.errors import LockNotOwned
from sieve.redis.entry import Entry
from sieve.redis.keys import PRIORITIES
from sieve.redis.queue_store import Claim, Popped, Rank, Requeued, TypesDeferred, now_ms
from sieve.settings import Settings


@dataclass
class FakeDevice:
    """One device: its queues (priority -> entries, head first), when its wait started, its state and lock."""

    weight: int = 1
    queues: dict[int, list[Entry]] = field(default_factory=lambda: {p: [] for p in PRIORITIES})
    #: when its wait started (ms): its oldest task's enqueue time, or when it was last served
    since_ms: float = 0.0
    #: "ready" (waits to be served), "serving" (a dispatcher holds its lock) or "idle" (nothing queued)
    state: str = "idle"
    token: str | None = None

    @property
    def queued(self) -> list[Entry]:
        return [e for p in reversed(PRIORITIES) for e in self.queues[p]]

    @property
    def head_priority(self) -> int:
        return max((p for p in PRIORITIES if self.queues[p]), default=0)


class FakeStore:
    """The scheduler's Redis stores in memory (see the module)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.now = now_ms()
        self.devices: dict[str, FakeDevice] = {}
        #: task_id -> (device, entry as leased: its attempt is the lease number)
        self.leases: dict[str, tuple[str, Entry]] = {}
        #: (device, entry, due ms) of tasks waiting out a delay
        self.delayed: list[tuple[str, Entry, float]] = []
        self.dead_letters: list[dict[str, Any]] = []
        self.drain: dict[str, float] = {}
        self._gpu_expected_until: float | None = None
        self._wake_ups: asyncio.Queue[None] = asyncio.Queue()

    # --- what tests set up ----------------------------------------------------------------------------
    def enqueue(self, mac: str, *entries: Entry, weight: int = 1) -> None:
        """Queues tasks at the back of their priority's queue; an idle device becomes ready (its wait starts at
        its oldest task) and a wake-up is published."""
        device = self.devices.setdefault(mac, FakeDevice(weight=weight))
        for e in entries:
            device.queues[e.priority].append(e)
        if device.state == "idle":
            device.state = "ready"
            device.since_ms = min(e.enqueued_ms for e in device.queued)
        self._wake_ups.put_nowait(None)

    def queued(self, mac: str) -> list[Entry]:
        return self.devices[mac].queued if mac in self.devices else []

    # --- QueueStore -----------------------------------------------------------------------------------
    def _now(self, now: float | None) -> float:
        return self.now if now is None else now

    async def rank(self, *, exclude: str | None = None, now: float | None = None) -> Rank:
        now = self._now(now)
        s = self.settings
        ready = {mac: d for mac, d in self.devices.items() if d.state == "ready" and d.queued}
        waits = {mac: now - d.since_ms for mac, d in ready.items()}
        longest = max(waits.values(), default=None)
        candidates = [mac for mac in ready if mac != exclude]
        if not candidates:
            return Rank(None, False, None, longest)

        def score(mac: str) -> tuple[int, float]:
            return ready[mac].head_priority, min(waits[mac], s.aging_max_wait_s * 1000) * ready[mac].weight

        best = max(candidates, key=score)
        starving = any(wait >= s.starvation_hint_s * 1000 for mac, wait in waits.items() if mac != best)
        return Rank(best, starving, None, longest)

    async def pop(
        self,
        mac: str,
        token: str,
        count: int,
        *,
        allowed_types: list[int] | None = None,
        release: bool = False,
        now: float | None = None,
        carry_ms: float = 0.0,
        budget: dict[int, int] | None = None,
    ) -> Popped:
        now = self._now(now)
        device = self.devices.get(mac)
        if device is None or device.token is not None or device.state != "ready":
            return Popped(ready=False)
        device.state, device.token = "serving", token
        device.since_ms = now - carry_ms
        taken: list[Entry] = []
        expired: list[Entry] = []
        blocked = 0
        while len(taken) < count and device.head_priority:
            queue = device.queues[device.head_priority]
            head = queue[0]
            refused = (allowed_types is not None and head.task_type not in allowed_types) or (
                budget is not None and budget.get(head.task_type, 0) <= 0
            )
            if head.expires_ms > now and refused:
                blocked = head.task_type
                break
            queue.pop(0)
            if head.expires_ms <= now:
                expired.append(head)
                continue
            if budget is not None:
                budget[head.task_type] -= 1
            leased = head.with_attempt(head.attempt + 1)
            self.leases[leased.task_id] = (mac, leased)
            taken.append(leased)
        if release:
            await self.release(mac, token, now=now)
        return Popped(True, taken, expired, blocked)

    async def claim(
        self,
        token: str,
        want: int,
        budget: dict[int, int] | None,
        *,
        max_devices: int,
        per_device: int | None = None,
        carry_max_ms: float = 0.0,
        ms_per_task: float = 1.0,
        now: float | None = None,
    ) -> Claim:
        """rank and pop (released) for the next devices, as claimDevices does, until `want` tasks, `max_devices`
        devices or the budget is spent, or a device already claimed in this call comes up again."""
        now = self._now(now)
        left = dict(budget) if budget is not None else None
        devices: list[tuple[str, Popped]] = []
        total = 0
        refused: set[str] = set()
        rank = await self.rank(now=now)
        while (
            rank.mac
            and rank.mac not in refused
            and total < want
            and len(devices) < max_devices
            and (left is None or any(left.values()))
        ):
            size = self.settings.min_batch_size if rank.starving else (per_device or self.settings.batch_size)
            popped = await self.pop(
                rank.mac, f"{token}:{len(devices) + 1}", min(size, want - total), release=True, now=now, budget=left
            )
            devices.append((rank.mac, popped))
            total += len(popped.taken)
            refused.add(rank.mac)
            rank = await self.rank(exclude=rank.mac if rank.starving or not popped.ready else None, now=now)
        return Claim(devices, rank)

    async def release(self, mac: str, token: str, *, now: float | None = None) -> None:
        device = self.devices[mac]
        if token != "*" and device.token != token:
            raise LockNotOwned(f"lock of {mac} is not held by {token}")
        device.token = None
        device.state = "ready" if device.queued else "idle"

    def _dead_letter(self, mac: str, e: Entry, reason: str, now: float) -> dict[str, Any]:
        record = {
            "task_id": e.task_id,
            "device": mac,
            "task_type": e.task_type,
            "priority": e.priority,
            "error": reason,
            "attempts": e.failures,
            "requeue_count": 0,
            "enqueued_ms": e.enqueued_ms,
            "dead_ms": int(now),
        }
        self.dead_letters.insert(0, record)
        return record

    def _take_lease(self, task_id: str, attempt: int | None) -> Entry | None:
        held = self.leases.get(task_id)
        if held is None or (attempt is not None and held[1].attempt != attempt):
            return None
        del self.leases[task_id]
        return held[1]

    def _back_to_front(self, mac: str, entries: list[Entry]) -> None:
        device = self.devices[mac]
        for e in reversed(entries):
            device.queues[e.priority].insert(0, e)
        if device.state == "idle" and entries:
            device.state = "ready"

    async def requeue(
        self,
        mac: str,
        leases: list[tuple[str, int | None]],
        *,
        count_attempt: bool,
        reason: str,
        retry_at_ms: float | None = None,
        max_attempts: int | None = None,
        now: float | None = None,
    ) -> Requeued:
        now = self._now(now)
        limit = self.settings.max_attempts if max_attempts is None else max_attempts
        back: list[Entry] = []
        dead: list[dict[str, Any]] = []
        put_back: list[str] = []
        for task_id, attempt in leases:
            e = self._take_lease(task_id, attempt)
            if e is None:
                continue
            if count_attempt:
                e = replace(e, failures=e.failures + 1)
            if count_attempt and e.failures >= limit:
                dead.append(self._dead_letter(mac, e, reason, now))
            elif retry_at_ms is not None and retry_at_ms > now:
                self.delayed.append((mac, e, retry_at_ms))
                put_back.append(task_id)
            else:
                back.append(e)
                put_back.append(task_id)
        self._back_to_front(mac, back)
        return Requeued(len(back), dead, put_back)

    async def defer_types(
        self, mac: str, token: str, task_ids: list[str], task_types: list[int], reason: str, *, now: float | None = None
    ) -> TypesDeferred:
        now = self._now(now)
        device = self.devices[mac]
        if device.token != token:
            raise LockNotOwned(f"lock of {mac} is not held by {token}")
        s = self.settings
        going = [e for e in (self._take_lease(t, None) for t in task_ids) if e is not None]
        for p in PRIORITIES:
            going += [e for e in device.queues[p] if e.task_type in task_types]
            device.queues[p] = [e for e in device.queues[p] if e.task_type not in task_types]
        waiting: list[str] = []
        dead: list[dict[str, Any]] = []
        due_times: list[float] = []
        for e in going:
            e = replace(e, defers=e.defers + 1)
            if e.defers >= s.max_attempts:
                dead.append(self._dead_letter(mac, e, reason, now))
                continue
            due = now + min(s.defer_backoff_base_s * 2 ** (e.defers - 1), s.defer_backoff_max_s) * 1000
            self.delayed.append((mac, e, due))
            waiting.append(e.task_id)
            due_times.append(due)
        await self.release(mac, token, now=now)
        return TypesDeferred(int(min(due_times, default=0)), waiting, dead)

    async def resume_due(self, *, now: float | None = None, limit: int = 500) -> list[str]:
        return []  # nothing in this fake is backed off as a whole device

    async def publish_drain(self, replica: str, tasks_per_s: float, *, now: float | None = None) -> None:
        self.drain[replica] = tasks_per_s

    # --- SchedulerState -------------------------------------------------------------------------------
    async def mark_gpu_expected(self, window_ms: int) -> None:
        self._gpu_expected_until = self.now + window_ms

    async def gpu_expected(self) -> bool:
        return self._gpu_expected_until is not None and self.now < self._gpu_expected_until

    async def wake_ups(self) -> AsyncGenerator[None, None]:
        while True:
            await self._wake_ups.get()
            yield None


class FakeOutcomes:
    """What the dispatcher reports, kept: expired entries, dead-letter records and history notes."""

    def __init__(self) -> None:
        self.expired_entries: list[Entry] = []
        self.dead: list[dict[str, Any]] = []
        self.notes: list[tuple[list[str], str]] = []

    async def expired(self, entries: list[Entry]) -> None:
        self.expired_entries += entries

    async def dead_lettered(self, records: list[dict[str, Any]]) -> None:
        self.dead += records

    async def noted(self, task_ids: list[str], detail: str) -> None:
        if task_ids:
            self.notes.append((task_ids, detail))


def entry(
    task_id: str,
    task_type: int = 1,
    *,
    priority: int = 3,
    age_s: float = 1.0,
    expires_in_s: float = 3600.0,
    failures: int = 0,
) -> Entry:
    """A queue entry as intake writes it (attempt 0), enqueued `age_s` ago, expiring `expires_in_s` from now."""
    now = now_ms()
    return Entry(
        task_id, task_type, priority, int(now - age_s * 1000), int(now + expires_in_s * 1000), failures=failures
    )
