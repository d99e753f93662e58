"""The dispatch loop: claim the next devices of the fair order, hand their tasks to workers with credits.

One claim round (`QueueStore.claim`, the claimDevices script) takes, in one round trip, the devices the fair
order names one after another — the caller first, then its device (`lua/includes/rankNext.lua`) — and their
tasks, for as many tasks as the workers have credits (by type); each device is claimed and released on its
own, as one claim at a time would. The tasks go out in one batch per worker, whatever the number of devices.
It runs as soon as work and credits both exist: new work wakes it through the Redis wake channel, new credits
through the board. Starvation (another device waited past the hint) shrinks each device's share of a round to
the minimum batch and skips the device just served at the next choice, so that service spreads over many
devices instead of going in large batches to a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import AsyncGenerator
from typing import Protocol

from scheduler_svc.board import Board, Placement
from scheduler_svc.drain import DrainMeter
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.routing import Action, Router
from scheduler_svc.sessions import Session
from scheduler_svc.tracing import DispatchObserver
from sieve.redis.entry import Entry
from sieve.redis.queue_store import Claim, QueueStore, Rank, now_ms
from sieve.settings import Settings

log = logging.getLogger("sieve.scheduler.dispatch")

IDLE_POLL_S = 1.0
#: most devices one claim round takes tasks from (bounds the time one claimDevices call holds Redis)
CLAIM_MAX_DEVICES = 256
#: the clock of a claim round runs on by about the workers' time per task for each task taken (ms), within these
MS_PER_TASK_MIN = 0.01
MS_PER_TASK_MAX = 2.0
#: the least time between two claims of one round (ms; claimDevices' STEP)
CLAIM_STEP_MS = 0.01
#: a round's clock runs at most this far ahead of real time (ms)
MAX_AHEAD_MS = 100.0


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
        #: where the last claim round's clock stopped (ms): each claim of a round happens 1 / dispatch rate per
        #: task after the one before (claimDevices), about when the workers would have taken the tasks; the next
        #: round starts there rather than at real time when that is still ahead, so that time runs one way
        self.claim_clock_ms = 0.0
        self._last_round: tuple[float, int] = (0.0, 0)
        self._ms_per_task_ewma = 0.2
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
        """Sets `wake` whenever a device becomes schedulable (published by enqueueMany)."""
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
        while not self._stopping.is_set():
            if self.board.credits <= 0:
                self.board.changed.clear()
                if self.board.credits <= 0:
                    await self.board.changed.wait()
                continue
            try:
                await self.dispatch_once()
                await self.drain.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch failed; retrying")
                await asyncio.sleep(0.2)

    async def dispatch_once(self) -> Claim:
        """One claim-and-hand-out round: claims the next devices of the fair order (caller, then device) for
        the workers' credits in one round trip, hands their tasks out, then waits when there was nothing to
        take (for work, for credits, or for the first device to come out of backoff)."""
        self.wake.clear()
        budgets = self.router.budgets()
        want = min(self.board.credits, sum(budgets.values()))
        real = now_ms()
        # the rounds' clock (see `claim_clock_ms`): never behind real time, at most MAX_AHEAD_MS ahead of it
        now = max(real, min(self.claim_clock_ms, real + MAX_AHEAD_MS))
        if want <= 0:
            # credits only for types that may not run now: the next device's task goes to routing (it waits its
            # turn, waits out a delay with the rest of its type, or is dead-lettered)
            claim = Claim([], await self.queues.rank(now=now))
            if claim.next.mac is not None and await self._blocked(claim.next.mac):
                return claim
        else:
            # a device served a little after it overtook the runner-up keeps that overshoot, at most two claim
            # intervals (a newcomer loses at most that) and the setting: without it claims made one round at a
            # time blur the weights
            gap = max(0.0, real - self._last_claim_ms)
            self._last_claim_ms = real
            ms_per_task = self._ms_per_task(real)
            claim_ns = self.observer.claim_started()
            claim = await self.queues.claim(
                uuid.uuid4().hex,
                want,
                budgets,
                max_devices=min(want, CLAIM_MAX_DEVICES),
                carry_max_ms=min(2 * gap, self.settings.aging_carry_max_ms),
                ms_per_task=ms_per_task,
                now=now,
            )
            self.claim_clock_ms = now + sum(max(CLAIM_STEP_MS, len(p.taken) * ms_per_task) for _, p in claim.devices)
            self._last_round = (real, claim.taken)
            await self._hand_out_claim(claim, budgets, claim_ns)
        if claim.taken == 0:
            await self._idle_until_work(claim.next)
        return claim

    def _ms_per_task(self, real: float) -> float:
        """About how long the workers take per task (ms): the real time since the last round over the tasks it
        took, smoothed, within [MS_PER_TASK_MIN, MS_PER_TASK_MAX] (a round after a quiet time says little)."""
        at, tasks = self._last_round
        if tasks > 0 and at > 0:
            sample = min(MS_PER_TASK_MAX, max(MS_PER_TASK_MIN, (real - at) / tasks))
            self._ms_per_task_ewma += 0.2 * (sample - self._ms_per_task_ewma)
        return self._ms_per_task_ewma

    async def _hand_out_claim(self, claim: Claim, budgets: dict[int, int], claim_ns: int) -> None:
        """Hands out what a claim took, one batch per worker whatever the number of devices; then the devices
        whose next task is of a type that no worker may run now go to routing (`_blocked`)."""
        expired = [e for _, popped in claim.devices for e in popped.expired]
        if expired:
            await self.outcomes.expired(expired)
        taken = [
            (mac, self.observer.claimed(mac, popped.taken, claim_ns, claim.next.starving))
            for mac, popped in claim.devices
            if popped.taken
        ]
        await self._hand_out(taken)
        for mac, popped in claim.devices:
            if popped.blocked and not popped.taken and popped.blocked not in budgets:
                await self._blocked(mac)

    async def _hand_out(self, taken: list[tuple[str, list[Entry]]], token: str | None = None) -> bool:
        """Sends what has a worker, one batch per worker; what has none goes back (waits its turn, waits out a
        delay with the rest of its type, or is dead-lettered, as routing says). With `token` (one device, still
        locked) the device is released here. True when tasks were sent to wait out a delay."""
        placed: dict[Session, list[tuple[str, Entry]]] = defaultdict(list)
        deferred_any = False
        for mac, entries in taken:
            placement = self.board.place(mac, entries, self.router.route)
            for session, batch in placement.placed.items():
                placed[session].extend((mac, e) for e in batch)
            self.observer.unplaced(placement)
            for reason, task_ids in placement.notes.items():
                await self.outcomes.noted(task_ids, reason)
            deferred_any = await self._unplaced(mac, placement, token) or deferred_any
        for session, items in placed.items():
            self.board.send_many(session, items)
            self.observer.sent(session, items)
            self.dispatched += len(items)
        return deferred_any

    async def _unplaced(self, mac: str, placement: Placement, token: str | None) -> bool:
        """What of one device's tasks no worker took: back to the queue, dead-lettered, or sent to wait (the
        device still locked with `token` is released here). True when tasks were sent to wait out a delay."""
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

    async def _idle_until_work(self, rank: Rank) -> None:
        """Nothing was taken: waits for new work or, when devices are ready but none of their next tasks has a
        worker with room, for credits to change; resumes devices whose backoff is over."""
        wait_s = IDLE_POLL_S
        if rank.next_backoff_ms is not None:
            wait_s = min(wait_s, (rank.next_backoff_ms - now_ms()) / 1000)
        if wait_s <= 0:
            await self.queues.resume_due()
        elif rank.mac is None:
            await self._idle(wait_s)
        else:
            self.board.changed.clear()
            waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(self.board.changed.wait())]
            try:
                await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            self.wake.clear()

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
        return await self._hand_out([(mac, self.observer.claimed(mac, popped.taken, claim_ns))], token)

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
