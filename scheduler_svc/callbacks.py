"""Completion callbacks: `CallbackNotifier` POSTs each final task to its callback_url from the PostgreSQL outbox
(sieve/db/callbacks.py), signed, retried with backoff until a 2xx or the retry period's end.

Every scheduler replica runs one; they share the outbox through `FOR UPDATE SKIP LOCKED` claims, so each due
delivery is attempted by one replica at a time, and a replica that dies mid-attempt leaves it due again when its
lease (the POST's time limit plus a margin) runs out: at least once, never lost. The notifier wakes on each
NOTIFY sieve_callbacks (a delivery was added; sieve/db/listener.py) and at least every
SIEVE_CALLBACK_POLL_INTERVAL_S, and sleeps until the next retry is due when nothing else is. A claim takes as many
due deliveries as there are free slots, with what their bodies need of their tasks, in one statement; outcomes are
recorded in batches (one UPDATE for what finished within a few milliseconds).

One attempt: the body (fixed at the first attempt, the same bytes every time), `X-Sieve-Timestamp` (Unix seconds),
`X-Sieve-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the caller's secret>`, `X-Sieve-Delivery`
(task id / history position: the same on every attempt, for the receiver to deduplicate) and `X-Sieve-Attempt`.
Outbound safety is the image fetcher's (sieve/outbound): public addresses only unless allowed, no redirects
followed, one time limit. A 2xx is DELIVERED; 410 Gone gives up at once; anything else (another status, a time
out, a refused address, no secret) is tried again after base x 2^(attempts-1) seconds, jittered, capped — or later
when the receiver's Retry-After asks (up to the cap) — until the retry period has passed: GAVE_UP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

from sieve.callback_config import signature
from sieve.db.callbacks import AttemptOutcome, CallbackStore, DueDelivery, body_of
from sieve.db.listener import CALLBACKS, ChangeSignal
from sieve.observe.metrics import CALLBACK_ATTEMPTS, CALLBACK_DELAY_SECONDS
from sieve.outbound.client import FetchError, SafeHttpClient
from sieve.outbound.policy import OutboundPolicy
from sieve.settings import Settings

log = logging.getLogger("sieve.scheduler.callbacks")

#: how much longer than one POST's time limit a claim holds a delivery
LEASE_MARGIN_S = 30.0
#: how long finished attempts are gathered before their outcomes are recorded (one UPDATE for all)
RECORD_GATHER_S = 0.005
#: largest body read back from a receiver (it is not used: only its status matters)
MAX_ANSWER_BYTES = 64 * 1024
USER_AGENT = "sieve-callbacks/1"


class CallbackNotifier:
    """Delivers due callbacks, `settings.callback_concurrency` at once (see the module)."""

    def __init__(self, store: CallbackStore, settings: Settings, signal: ChangeSignal | None = None) -> None:
        self.store = store
        self.settings = settings
        self.config = settings.callbacks
        self.signal = signal or ChangeSignal(settings.database_url, settings.database_schema, CALLBACKS)
        self.client: SafeHttpClient | None = None
        self._in_flight: dict[asyncio.Task[None], DueDelivery] = {}
        self._slot_free = asyncio.Event()
        self._outcomes: list[AttemptOutcome] = []
        self._outcome_ready = asyncio.Event()

    def _http(self) -> SafeHttpClient:
        if self.client is None:
            self.client = SafeHttpClient(
                OutboundPolicy.from_settings(self.settings),
                timeout_s=self.settings.callback_timeout_s,
                max_bytes=MAX_ANSWER_BYTES,
                max_redirects=0,
                headers={"User-Agent": USER_AGENT},
            )
        return self.client

    async def run(self) -> None:
        """Claims and sends due deliveries until cancelled; a failing database is retried (the outbox keeps
        everything meanwhile)."""
        self.signal.start()
        seen = self.signal.generation
        recorder = asyncio.create_task(self._record_outcomes(), name="sieve-callback-outcomes")
        try:
            while True:
                try:
                    started = await self.step()
                    if started:
                        continue  # more may be due at once
                    wait_s = self.settings.callback_poll_interval_s
                    due_in = await self.store.next_due_in_s()
                    if due_in is not None:
                        wait_s = min(wait_s, max(due_in, 0.005))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("callbacks: %s; trying again", exc)
                    wait_s = self.settings.callback_poll_interval_s
                seen = await self._idle(seen, wait_s)
        finally:
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
            await self.close()

    async def _idle(self, seen: int, wait_s: float) -> int:
        """Waits for a change, a free slot when all are taken, or `wait_s`."""
        self._slot_free.clear()  # before looking: a slot freed from now on sets it
        if len(self._in_flight) >= self.settings.callback_concurrency:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):  # not wait_for: see ChangeSignal.wait
                    await self._slot_free.wait()
            return seen
        return await self.signal.wait(seen, wait_s)

    async def step(self) -> int:
        """Claims as many due deliveries as there are free slots and starts their attempts; returns how many."""
        free = self.settings.callback_concurrency - len(self._in_flight)
        if free <= 0:
            return 0
        due = await self.store.claim(free, self.settings.callback_timeout_s + LEASE_MARGIN_S)
        if not due:
            return 0
        bodies = await self._bodies(due)
        for delivery in due:
            task = asyncio.create_task(self._attempt(delivery, bodies[(delivery.task_id, delivery.seq)]))
            self._in_flight[task] = delivery
            task.add_done_callback(self._finished)
        return len(due)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._slot_free.set()

    async def _bodies(self, due: list[DueDelivery]) -> dict[tuple[uuid.UUID, int], bytes]:
        """Each delivery's body: the stored one, or made now from the task and fixed (first attempt)."""
        bodies: dict[tuple[uuid.UUID, int], bytes] = {(d.task_id, d.seq): d.body for d in due if d.body is not None}
        fresh = [d for d in due if d.body is None]
        if fresh:
            bodies.update(await self.store.fix_bodies([(d.task_id, d.seq, body_of(d)) for d in fresh]))
        return bodies

    async def _attempt(self, delivery: DueDelivery, body: bytes) -> None:
        try:
            outcome = await self._send(delivery, body)
        except Exception as exc:  # never leave a claimed delivery unrecorded for a bug's sake: it is retried
            log.exception("callback %s: unexpected failure", delivery.delivery_id)
            outcome = self._retry(delivery, None, f"internal error: {type(exc).__name__}", None)
        self._outcomes.append(outcome)
        self._outcome_ready.set()

    async def _record_outcomes(self) -> None:
        """Records finished attempts in batches: what finished within RECORD_GATHER_S of the first, one UPDATE. An
        outcome that cannot be recorded is kept and tried again (its delivery is leased meanwhile)."""
        while True:
            await self._outcome_ready.wait()
            await asyncio.sleep(RECORD_GATHER_S)
            self._outcome_ready.clear()
            await self._flush()

    async def _flush(self) -> None:
        batch, self._outcomes = self._outcomes, []
        if not batch:
            return
        try:
            await self.store.record(batch)
        except Exception as exc:
            log.warning("callbacks: %d outcomes not recorded (%s); trying again", len(batch), exc)
            self._outcomes[:0] = batch
            await asyncio.sleep(self.settings.callback_poll_interval_s)
            self._outcome_ready.set()

    async def _send(self, delivery: DueDelivery, body: bytes) -> AttemptOutcome:
        secret = self.config.secret(delivery.caller)
        if secret is None:
            return self._retry(delivery, None, "no callback secret for the caller (SIEVE_CALLBACK_SECRETS)", None)
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Sieve-Timestamp": stamp,
            "X-Sieve-Signature": signature(secret, stamp, body),
            "X-Sieve-Delivery": delivery.delivery_id,
            "X-Sieve-Attempt": str(delivery.attempts),
        }
        try:
            answer = await self._http().request(
                "POST", delivery.url, body=body, headers=headers, follow_redirects=False
            )
        except FetchError as exc:
            CALLBACK_ATTEMPTS.labels(outcome="failed").inc()
            if exc.status == 410:
                return AttemptOutcome(delivery.task_id, delivery.seq, "GAVE_UP", exc.status, str(exc))
            return self._retry(delivery, exc.status, str(exc), _retry_after_s(exc.retry_after))
        CALLBACK_ATTEMPTS.labels(outcome="delivered").inc()
        CALLBACK_DELAY_SECONDS.observe(max(0.0, (datetime.now(UTC) - delivery.created_at).total_seconds()))
        return AttemptOutcome(delivery.task_id, delivery.seq, "DELIVERED", answer.status, None)

    def _retry(
        self, delivery: DueDelivery, http_status: int | None, error: str, retry_after_s: float | None
    ) -> AttemptOutcome:
        """PENDING again after the backoff, or GAVE_UP once the retry period has passed."""
        settings = self.settings
        now = datetime.now(UTC)
        delay = min(settings.callback_backoff_max_s, settings.callback_backoff_base_s * 2 ** (delivery.attempts - 1))
        delay *= random.uniform(0.8, 1.2)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, settings.callback_backoff_max_s))
        next_at = now + timedelta(seconds=delay)
        if next_at - delivery.created_at > timedelta(seconds=settings.callback_retry_period_s):
            log.warning("callback %s: gave up after %d attempts: %s", delivery.delivery_id, delivery.attempts, error)
            return AttemptOutcome(delivery.task_id, delivery.seq, "GAVE_UP", http_status, error)
        return AttemptOutcome(delivery.task_id, delivery.seq, "PENDING", http_status, error, next_at)

    async def close(self) -> None:
        """Stops: attempts in flight are cancelled and their deliveries made due again at once (not after their
        lease), for this or another replica to try."""
        interrupted = list(self._in_flight.items())
        for task, _ in interrupted:
            task.cancel()
        for task, _ in interrupted:
            with contextlib.suppress(BaseException):
                await task
        now = datetime.now(UTC)
        self._outcomes += [
            AttemptOutcome(d.task_id, d.seq, "PENDING", None, "interrupted: the scheduler stopped", now)
            for _, d in interrupted
        ]
        if self._outcomes:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self.store.record(self._outcomes)
            self._outcomes = []
        await self.signal.close()
        if self.client is not None:
            await self.client.close()
            self.client = None


def _retry_after_s(raw: str | None) -> float | None:
    """A Retry-After header's delay (seconds or an HTTP date), if the answer had one."""
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(raw) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None
