"""The dispatch loop: claim the best device, pop a batch, hand it to workers with credits, release.

It runs as soon as work and credits both exist: new work wakes it through the Redis wake channel,
new credits through the board. Starvation (another device waited past the hint) shrinks the batch to
the minimum and skips the device just served at the next claim, so that service spreads over many devices
instead of going in large batches to a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Protocol

from scheduler_svc.board import Board
from scheduler_svc.drain import DrainMeter
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.routing import Action, Router
from scheduler_svc.tracing import DispatchObserver
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, Rank, now_ms
from sieve.settings import Settings

log = logging.getLogger("sieve.scheduler.dispatch")

IDLE_POLL_S = 1.0


class WakeUps(Protocol):
    """The wake-ups published when a device becomes schedulable (`sieve.redis.scheduler_state.SchedulerState`)."""

    def wake_ups(self) -> AsyncGenerator[None, None]: ...


class Dispatcher:
    """Owns the dispatch loop (see the module): which device is served next, how many of its tasks are popped, and
    what becomes of those no worker takes (they wait their turn, wait out a delay with the rest of their type, or
    are dead-lettered, as routing says). Counts what it handed out and publishes the rate (`drain`)."""

    def __init__(
        self,
        queues: QueueStore,
        wake_ups: WakeUps,
        outcomes: Outcomes,
        board: Board,
        router: Router,
        settings: Settings,
    ) -> None:
        self.wake_ups = wake_ups
        self.router = router
        self.queues = queues
        self.outcomes = outcomes
        self.board = board
        self.settings = settings
        self.wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self.dispatched = 0
        self._last_claim_ms = 0.0
        #: claim / assign spans of each task and the dispatch metrics
        self.observer = DispatchObserver()
        #: this replica's dispatch rate, published for the intake's retry delays
        self.drain = DrainMeter(queues, lambda: self.dispatched)

    def stop(self) -> None:
        """Ends the loops (the drain step of an orderly stop)."""
        self._stopping.set()
        self.wake.set()
        self.board.changed.set()

    async def listen_for_work(self) -> None:
        """Sets `wake` whenever a device becomes schedulable (published by enqueueTasks)."""
        while not self._stopping.is_set():
            try:
                async with contextlib.aclosing(self.wake_ups.wake_ups()) as wake_ups:
                    async for _ in wake_ups:
                        self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("wake subscription lost: %s", exc)
                self.wake.set()
                await asyncio.sleep(0.5)

    async def _idle(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=max(0.001, timeout_s))
        self.wake.clear()

    async def run(self) -> None:
        rank: Rank | None = None
        while not self._stopping.is_set():
            if self.board.credits <= 0:
                self.board.changed.clear()
                if self.board.credits <= 0:
                    await self.board.changed.wait()
                rank = None  # waits grew while there was no room: rank afresh (weights depend on it)
                continue
            try:
                rank = await self.dispatch_once(rank)
                await self.drain.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch failed; retrying")
                rank = None
                await asyncio.sleep(0.2)

    async def dispatch_once(self, rank: Rank | None = None) -> Rank | None:
        """One claim-and-hand-out round. `rank` is the device to serve when already known; returns the
        next one (ranked in the same round trip, skipping the device just served) or None."""
        if rank is None or rank.mac is None:
            self.wake.clear()
            rank = await self.queues.rank()
            if rank.mac is None:
                await self._idle_until_work(rank)
                return None
        mac = rank.mac
        size = self.settings.min_batch_size if rank.starving else self.settings.batch_size
        size = max(1, min(size, self.board.credits))
        now = now_ms()
        carry = self._carry(rank, now)
        # under starvation the device just served sits out the next claim: service spreads over the waiting devices
        claim_ns = self.observer.claim_started()
        popped, next_rank = await self.queues.pop_and_rank(
            mac,
            uuid.uuid4().hex,
            size,
            self.router.allowed_types(),
            exclude=mac if rank.starving else None,
            carry_ms=carry,
            now=now,
        )
        if not popped.ready:  # another replica took it first
            return next_rank if next_rank.mac else None
        if popped.expired:
            await self.outcomes.expired(popped.expired)
        await self._hand_out(mac, self.observer.claimed(mac, popped.taken, claim_ns, rank.starving))
        if popped.blocked and not popped.taken:
            if await self._blocked(mac):
                return None  # that type waits now; the device's other types may be ready at once: rank afresh
            if next_rank.mac is None:  # nothing else to serve: wait for credits rather than spin
                self.board.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.board.changed.wait(), timeout=IDLE_POLL_S)
        return next_rank if next_rank.mac else None

    async def _hand_out(self, mac: str, entries: list[Entry], token: str | None = None) -> bool:
        """Sends what has a worker; what has none goes back (waits its turn, waits out a delay with the rest
        of its type, or is dead-lettered, as routing says). With `token` the device is still locked and is
        released here. True when tasks were sent to wait out a delay."""
        placement = self.board.place(mac, entries, self.router.route)
        for session, batch in placement.placed.items():
            self.board.send(session, mac, batch)
            self.observer.sent(session, mac, batch)
            self.dispatched += len(batch)
        self.observer.unplaced(placement)
        for reason, task_ids in placement.notes.items():
            await self.outcomes.noted(task_ids, reason)
        waiting = placement.unplaced.get(Action.WAIT.value, [])
        if waiting:
            await self.queues.requeue(
                mac, [(e.task_id, e.attempt) for e in waiting], count_attempt=False, reason="no worker had room"
            )
        doomed = placement.unplaced.get(Action.DEAD_LETTER.value, [])
        if doomed:
            reason = self.router.route(doomed[0].task_type).reason
            result = await self.queues.requeue(
                mac, [(e.task_id, e.attempt) for e in doomed], count_attempt=True, reason=reason, max_attempts=0
            )
            await self.outcomes.dead_lettered(result.dead_letters)
        deferred = placement.unplaced.get(Action.DEFER.value, [])
        if token is not None:
            if deferred:
                await self._defer(mac, token, deferred)
                return True
            await self.queues.release(mac, token)
        elif deferred:  # cannot happen on the main path: popping stops before types nobody may run
            await self.queues.requeue(
                mac, [(e.task_id, e.attempt) for e in deferred], count_attempt=False, reason="no worker takes its type"
            )
        return False

    def _carry(self, rank: Rank, now: float) -> float:
        """How much of its wait the device keeps when served: the wait it had beyond the point where it
        overtook the runner-up of its tier, up to now. Claims come one at a time, so a device is served
        a little after it overtook; dropping that overshoot every time biases shares against heavy
        devices. Bounded by two claim intervals (a newcomer loses at most that) and the setting."""
        gap = max(0.0, now - self._last_claim_ms)
        self._last_claim_ms = now
        overshoot = rank.overshoot_ms + max(0.0, now - rank.ranked_at_ms)
        return min(overshoot, 2 * gap, self.settings.aging_carry_max_ms)

    async def _idle_until_work(self, rank: Rank) -> None:
        wait_s = IDLE_POLL_S
        if rank.next_backoff_ms is not None:
            wait_s = min(wait_s, (rank.next_backoff_ms - now_ms()) / 1000)
        if wait_s <= 0:
            await self.queues.resume_due()
        else:
            await self._idle(wait_s)

    async def _blocked(self, mac: str) -> bool:
        """The device's next task is of a type no eligible worker has room for: take it alone, with the
        device locked, and let routing decide (wait for credits, wait out a delay with the rest of its type,
        or dead-letter). True when it was sent to wait out a delay."""
        token = uuid.uuid4().hex
        claim_ns = self.observer.claim_started()
        popped = await self.queues.pop(mac, token, 1)
        if not popped.ready:
            return False
        if popped.expired:
            await self.outcomes.expired(popped.expired)
        return await self._hand_out(mac, self.observer.claimed(mac, popped.taken, claim_ns), token)

    async def _defer(self, mac: str, token: str, entries: list[Entry]) -> None:
        """Tasks nobody can run now wait, with every queued task of their types of this device; the device
        itself is released and keeps being served for its other types."""
        types = sorted({e.task_type for e in entries})
        reason = "; ".join(dict.fromkeys(self.router.route(t).reason for t in types))
        deferred = await self.queues.defer_types(mac, token, [e.task_id for e in entries], types, reason)
        until_s = max(0.0, deferred.earliest_due_ms - now_ms()) / 1000
        log.info(
            "device %s: %d tasks wait %.0fs: %s", mac, len(deferred.waiting), until_s, reason, extra={"device": mac}
        )
        await self.outcomes.noted(deferred.waiting, f"waits {until_s:.0f}s (its type only): {reason}")
        await self.outcomes.dead_lettered(deferred.dead_letters)
