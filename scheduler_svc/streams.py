"""The Pull streams' protocol: what a worker's messages do to its session and to the queues.

A Pull stream opens with WorkerHello; then the worker sends credits, acks and nacks, and the scheduler sends
assignment batches (the stream itself is `scheduler_svc.servicer`). A worker may hold as many tasks as its
registered concurrency: credits of a worker that has not registered yet are kept until its record appears. Only
acks and nacks of leases the stream holds, under their exact token, count; an ack for a task that PostgreSQL does
not show finished puts it back instead of removing it. When the stream ends, whatever the worker still held goes
back to the front of its device's queue (the attempt counts: the worker may have died in the middle of it).

A worker whose previous stream broke re-announces in its first hello the leases it still holds (running, or
settled without knowing whether the ack or nack arrived), and sends those acks and nacks in the same message.
When the scheduler that handed them out died, this one adopts each lease that Redis still holds under the same
lease number, presented with its exact token (signed for this worker id: `sieve.redis.leases`), that no other stream
here holds, and that no live holder renews (a lease renewed within `housekeeping_interval_s + 1 s` waits, and is
looked at again, until it is not); the acks and nacks then settle through the normal paths at once, instead of
the tasks waiting for their leases to expire.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TypeVar

from scheduler_svc.board import Board
from scheduler_svc.cost import CostMeter
from scheduler_svc.lifecycle import Returned, Returns
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.sessions import Handed, Session, Settlement
from sieve.backoff import compute_backoff
from sieve.errors import InvalidInput
from sieve.fields import storable
from sieve.observe import telemetry
from sieve.redis.leases import lease_number
from sieve.redis.queue_store import LeaseFact, QueueStore, now_ms
from sieve.redis.worker_records import KNOWN_TASK_TYPES, WorkerRecords, worker_id_problem
from sieve.v1 import scheduler_pb2

log = logging.getLogger("sieve.scheduler.pull")

#: an Ack or a Nack (what `_sift` sorts keeps its type)
S = TypeVar("S", scheduler_pb2.Ack, scheduler_pb2.Nack)

#: longest nack reason kept (the rest is cut); a task's history and dead letter hold it
MAX_REASON_CHARS = 500
#: most acks or nacks honoured in one message (a worker never holds more than its concurrency)
MAX_SETTLEMENTS = 10_000
#: a re-announced lease renewed less than this long ago (beyond one housekeeping interval) may still have a live
#: holder: it waits
ADOPT_STALE_S = 1.0
#: assignment times a reconnecting worker claims are believed back this far, at most
MAX_CLAIMED_AGE_S = 86_400.0


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) <= 36


def hello_problem(hello: scheduler_pb2.WorkerHello, field: str = "hello") -> tuple[str, str] | None:
    """(field, description) of what is wrong with a WorkerHello, or None."""
    problem = worker_id_problem(hello.worker_id)
    if problem is not None:
        return f"{field}.worker_id", problem
    if len(hello.task_types) > len(KNOWN_TASK_TYPES):
        return f"{field}.task_types", f"has more than {len(KNOWN_TASK_TYPES)} entries"
    unknown = [t for t in hello.task_types if t not in KNOWN_TASK_TYPES]
    if unknown:
        return f"{field}.task_types", f"{unknown[0]} is not a known task type"
    return None


class PullStreams:
    """Owns the Pull streams' protocol (see the module): how many tasks a stream may hold (the worker's registered
    concurrency), which acks and nacks count, what goes back when a stream ends, and the adoption of re-announced
    leases. Counts fencing refusals, unproven acks and what became of re-announced leases."""

    def __init__(
        self,
        queues: QueueStore,
        board: Board,
        outcomes: Outcomes,
        records: WorkerRecords,
        *,
        costs: CostMeter | None = None,
    ) -> None:
        self.queues = queues
        #: fair by cost: charges devices for what their acked tasks cost (None: every task is counted alike)
        self.costs = costs
        self.board = board
        self.outcomes = outcomes
        self.records = records
        self.fencing_refusals = 0
        #: acks settled (the task's lease removed): tasks this replica saw finished
        self.acked = 0
        #: acks refused because PostgreSQL did not show the task finished (the task was put back)
        self.unproven_acks = 0
        #: credits of streams whose worker had not registered yet, kept (the worker does not send them again)
        #: until its record appears: the session -> (credits asked, the task looking for the record)
        self._unregistered: dict[Session, tuple[int, asyncio.Task[None]]] = {}
        #: every take-back goes through here (Redis, dead letters at the task's limit, the PENDING record)
        self.returns = Returns(queues, outcomes)
        #: leases re-announced by reconnecting workers, by what became of them: adopted, acked / nacked (their
        #: settlement came with them), gone (already settled or taken back), refused (bad token, another holder)
        self.reconnect_leases: Counter[str] = Counter()
        #: re-announced acks and nacks of leases already gone, dropped (not fencing refusals: nothing ran twice)
        self.reannounced_gone = 0
        self._adopting: dict[Session, asyncio.Task[None]] = {}

    async def start(self, session: Session, first: scheduler_pb2.PullRequest) -> None:
        """A stream's first message: the leases it re-announces are looked at, then it is handled as any other."""
        if first.hello.held:
            await self._adopt_on_open(session, first)
        await self.handle(session, first)

    async def handle(self, session: Session, request: scheduler_pb2.PullRequest) -> None:
        """One message of the stream: a later hello, acks, nacks, credits, draining."""
        session.heard_from()
        if request.HasField("hello"):
            if request.hello.worker_id and request.hello.worker_id != session.worker_id:
                raise InvalidInput("hello.worker_id", "a stream keeps the worker id of its first hello")
            if hello_problem(request.hello) is None and self.board.update(session, request.hello):
                log.info(
                    "worker %s now: gpu=%s, task types %s",
                    session.worker_id,
                    session.gpu,
                    sorted(session.task_types),
                    extra={"worker": session.worker_id},
                )
            session.cap_credits(await self._credit_cap(session))  # it may have registered again
        if request.acks:
            await self._ack(session, list(request.acks)[:MAX_SETTLEMENTS])
        if request.nacks:
            await self._nack(session, list(request.nacks)[:MAX_SETTLEMENTS])
        if request.draining:
            self.board.drop_credits(session)
            self._forget_unregistered(session)
        elif request.credits:
            if not session.credit_cap:  # not registered when the stream opened: look again
                session.cap_credits(await self._credit_cap(session))
            if session.credit_cap:
                self.board.add_credits(session, request.credits)
            else:
                self._await_registration(session, request.credits)

    async def _credit_cap(self, session: Session) -> int:
        """The worker's registered concurrency; an anonymous worker (SIEVE_ALLOW_ANONYMOUS) that never
        registered gets the fleet maximum, an authenticated one nothing until it registers."""
        record = await self.records.get(session.worker_id)
        if record is not None and record.concurrency:
            return min(record.concurrency, self.queues.settings.max_worker_concurrency)
        return self.queues.settings.max_worker_concurrency if session.anonymous else 0

    def _await_registration(self, session: Session, credits: int) -> None:
        """Keeps the credits of a stream whose worker has not registered yet (its Register may land just after
        the stream opened) and grants them, up to its concurrency, once its record appears."""
        asked, waiter = self._unregistered.get(session, (0, None))
        if waiter is None:
            waiter = asyncio.create_task(self._grant_when_registered(session), context=telemetry.detached_context())
        self._unregistered[session] = (min(asked + credits, self.queues.settings.max_worker_concurrency), waiter)

    async def _grant_when_registered(self, session: Session) -> None:
        delay_s = 0.1
        while not session.closed:
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)
            try:
                session.cap_credits(await self._credit_cap(session))
            except Exception as exc:  # Redis away: look again later
                log.info("worker %s: registration not read: %s", session.worker_id, exc)
                continue
            if session.credit_cap:
                asked, _ = self._unregistered.pop(session, (0, None))
                self.board.add_credits(session, asked)
                return

    def _forget_unregistered(self, session: Session) -> None:
        _, waiter = self._unregistered.pop(session, (0, None))
        if waiter is not None and waiter is not asyncio.current_task():
            waiter.cancel()

    def _charges(
        self, session: Session, acks: list[scheduler_pb2.Ack], device_of: dict[str, str]
    ) -> dict[str, float] | None:
        """What each device is charged for the worker time of its acked tasks (scheduler_svc/cost.py)."""
        if self.costs is None:
            return None
        costs = [
            (device_of[a.task_id], handed.task_type, float(a.worker_time_ms))
            for a in acks
            if a.worker_time_ms and (handed := session.handed.get(a.task_id)) is not None
        ]
        return self.costs.charges(costs) if costs else None

    async def _ack(self, session: Session, acks: list[scheduler_pb2.Ack]) -> None:
        """Settles acks for leases this stream holds. A task PostgreSQL does not show finished (a worker that
        acks without storing a result) is put back with its attempt counted, not removed — unless PostgreSQL
        records a newer hand-out of it than this one (this one was overtaken and is only settled)."""
        acks = self._sift(session, acks)
        if not acks:
            return
        mine = [a for a in acks if self.board.holds(session, a.task_id, a.lease_token)]
        if len(mine) < len(acks):
            self.fencing_refusals += len(acks) - len(mine)
            log.info(
                "%d acks refused: not a lease of this stream",
                len(acks) - len(mine),
                extra={"worker": session.worker_id},
            )
        if not mine:
            return
        try:
            unfinished = await self.outcomes.tasks.unfinished([uuid.UUID(a.task_id) for a in mine])
        except Exception as exc:  # cannot tell: put them back uncounted (a finished one is refused again)
            log.warning("acks of %d tasks not verified (%s): put back", len(mine), exc)
            await self._put_back(session, [(a, "ack not verified: PostgreSQL unavailable", False) for a in mine])
            return

        # an open task whose recorded lease is newer than this hand-out's was overtaken (the worker's start was
        # refused): this ack settles only its own stale lease; the newer hand-out goes on untouched
        def settled(ack: scheduler_pb2.Ack) -> bool:
            recorded = unfinished.get(uuid.UUID(ack.task_id))
            return recorded is None or recorded > session.held[ack.task_id][1]

        proven = [a for a in mine if settled(a)]
        unproven = [a for a in mine if not settled(a)]
        if proven:
            leased = [(a.task_id, session.held[a.task_id][1]) for a in proven]
            # their ASSIGNED records, if still waiting, would change nothing now: not written
            self.outcomes.lifecycle.settled((uuid.UUID(task_id), lease) for task_id, lease in leased)
            device_of = {a.task_id: session.held[a.task_id][0] for a in proven}
            results = await self.queues.ack(
                leased, device_of=device_of, charges=self._charges(session, proven, device_of)
            )
            stale = results.count(False)
            self.acked += len(results) - stale
            if stale:
                self.fencing_refusals += stale
                log.info(
                    "%d acks refused: stale lease (the task was handed out again)",
                    stale,
                    extra={"worker": session.worker_id},
                )
            self.board.forget(session, [a.task_id for a in proven])
        if unproven:
            self.unproven_acks += len(unproven)
            log.warning(
                "worker %s acked %d tasks without a stored result: put back",
                session.worker_id,
                len(unproven),
                extra={"worker": session.worker_id},
            )
            await self._put_back(session, [(a, "acked without a stored result", True) for a in unproven])

    def _sift(self, session: Session, items: Sequence[S]) -> list[S]:
        """Acks or nacks minus those of re-announced leases: one waiting to be adopted keeps its settlement for
        then; one already gone is dropped (it was settled, or taken back, before this stream)."""
        if not session.claims and not session.gone:
            return list(items)
        kept: list[S] = []
        for item in items:
            if item.task_id in session.held:
                kept.append(item)
            elif item.task_id in session.claims:
                session.keep_settlement(item)
            elif item.task_id in session.gone:
                self.reannounced_gone += 1
            else:
                kept.append(item)
        return kept

    async def _put_back(self, session: Session, items: list[tuple[scheduler_pb2.Ack, str, bool]]) -> None:
        await self._nack(
            session,
            [
                scheduler_pb2.Nack(task_id=a.task_id, lease_token=a.lease_token, reason=reason, count_attempt=counts)
                for a, reason, counts in items
            ],
            nacked=False,
        )

    async def _nack(self, session: Session, nacks: list[scheduler_pb2.Nack], *, nacked: bool = True) -> None:
        """Nacked tasks go back after their retry delay: the worker's (capped), or for a counted failure the
        exponential retry backoff of its attempt; a counted one at its max attempts is dead-lettered. Only leases
        this stream holds, under their exact token, count. The task's history says "nacked: <reason>"."""
        nacks = self._sift(session, nacks)
        Key = tuple[str, bool, float, str]
        by_key: dict[Key, list[Returned]] = defaultdict(list)
        now = now_ms()
        s = self.queues.settings
        for n in nacks:
            handed = session.handed.get(n.task_id)
            held = (
                self.board.release(session, n.task_id) if self.board.holds(session, n.task_id, n.lease_token) else None
            )
            if held is None:
                self.fencing_refusals += 1
                continue
            mac, lease = held
            delay_s = n.retry_after.ToMilliseconds() / 1000 if n.HasField("retry_after") else 0.0
            delay_s = min(max(0.0, delay_s), s.defer_backoff_max_s)
            if n.count_attempt and not delay_s:
                failures = handed.failures if handed is not None else 0
                delay_s = compute_backoff(
                    failures + 1, base_s=s.retry_backoff_base_s, max_s=s.retry_backoff_max_s, jitter=False
                )
            reason = storable((n.reason or "nacked")[:MAX_REASON_CHARS])
            key = (mac, n.count_attempt, round(now + delay_s * 1000, 1), reason)
            by_key[key].append(Returned(n.task_id, lease, session.worker_id))
        for (mac, counts, retry_at, reason), items in by_key.items():
            await self.returns.put_back(
                mac,
                items,
                counted=counts,
                reason=reason,
                detail=f"nacked: {reason}" if nacked else reason,
                retry_at_ms=retry_at if retry_at > now else None,
                now=now,
            )

    async def end_session(self, session: Session, reason: str, *, count_attempt: bool = True) -> None:
        """Closes a session and puts back what it held."""
        self._forget_unregistered(session)
        adopting = self._adopting.pop(session, None)
        if adopting is not None and adopting is not asyncio.current_task():
            adopting.cancel()
        if session.closed and not session.held:
            return
        held = self.board.close(session)
        for mac, leases in held.items():
            await self.returns.put_back(
                mac, [Returned(t, a, session.worker_id) for t, a in leases], counted=count_attempt, reason=reason
            )
        if held:
            log.info(
                "worker %s: %d held tasks put back (%s)",
                session.worker_id,
                sum(len(v) for v in held.values()),
                reason,
                extra={"worker": session.worker_id},
            )
            await self.outcomes.lifecycle.flush()

    # --- leases re-announced by a reconnecting worker ----------------------------------------------
    async def _adopt_on_open(self, session: Session, first: scheduler_pb2.PullRequest) -> None:
        """Looks at the leases the first hello re-announces; when Redis does not answer, they wait and are looked at
        again."""
        try:
            await self._adopt(session, first)
        except Exception as exc:  # Redis away: the claims wait, and are looked at again
            log.warning("worker %s: re-announced leases not checked yet: %s", session.worker_id, exc)
            self._adopting[session] = asyncio.create_task(
                self._adopt_later(session), context=telemetry.detached_context()
            )

    async def _adopt(self, session: Session, first: scheduler_pb2.PullRequest) -> None:
        """Takes the leases the first hello re-announces into this stream where they check out (see the module);
        those that may still have a live holder wait (`_adopt_later`)."""
        now_s, now_wall = time.monotonic(), time.time()
        refused = 0
        signer = self.board.signer
        assert signer is not None
        for held in list(first.hello.held)[:MAX_SETTLEMENTS]:
            if held.task_id in session.claims:
                continue
            if not _is_uuid(held.task_id) or signer.verify(held.task_id, session.worker_id, held.lease_token) is None:
                refused += 1
                continue
            claimed = held.assigned_at.ToMilliseconds() / 1000 if held.HasField("assigned_at") else now_wall
            age_s = min(max(0.0, now_wall - claimed), MAX_CLAIMED_AGE_S)
            session.claim(held.task_id, held.lease_token, now_s - age_s)
        self.reconnect_leases["refused"] += refused
        if refused:
            log.warning(
                "worker %s re-announced %d leases with tokens that are not its own: refused",
                session.worker_id,
                refused,
                extra={"worker": session.worker_id},
            )
        adopted = await self._try_claims(session, settle=False)
        # the acks and nacks of the same message are for these leases: count them as settled by the reconnect
        for kind, items in (("acked", first.acks), ("nacked", first.nacks)):
            self.reconnect_leases[kind] += sum(1 for i in items if i.task_id in session.held)
        log.info(
            "worker %s reconnected: %d re-announced leases adopted, %d settlements with them, %d waiting, "
            "%d already gone, %d refused",
            session.worker_id,
            adopted,
            sum(1 for i in first.acks if i.task_id in session.held)
            + sum(1 for i in first.nacks if i.task_id in session.held),
            len(session.claims),
            sum(1 for h in first.hello.held if h.task_id in session.gone),
            refused,
            extra={"worker": session.worker_id},
        )
        if session.claims:
            self._adopting[session] = asyncio.create_task(
                self._adopt_later(session), context=telemetry.detached_context()
            )

    async def _try_claims(self, session: Session, *, settle: bool = True) -> int:
        """Adopts the session's claims that check out now; drops those whose lease is gone or held here by another
        stream; leaves the rest. With `settle`, settlements that waited for their lease are settled. Returns how
        many were adopted."""
        ids = list(session.claims)
        if not ids:
            return 0
        facts = await self.queues.lease_facts(ids)
        s = self.queues.settings
        fresh_after = now_ms() + (s.lease_ttl_s - s.housekeeping_interval_s - ADOPT_STALE_S) * 1000
        adopted: list[str] = []
        settlements: list[Settlement] = []
        holders = {t: other for other in self.board.sessions for t in other.held}
        for task_id in ids:
            claim = session.claims[task_id]
            fact = self._standing(session, task_id, facts.get(task_id), holders.get(task_id))
            if fact is None:
                continue
            if fact.deadline_ms > fresh_after:  # renewed lately: its holder may be alive; look again later
                continue
            self.board.adopt(
                session,
                task_id,
                fact.mac,
                fact.entry.attempt,
                claim.token,
                Handed(claim.assigned_at, fact.entry.task_type, fact.entry.failures),
            )
            adopted.append(task_id)
            if claim.settlement is not None:
                settlements.append(claim.settlement)
        if adopted:
            self.reconnect_leases["adopted"] += len(adopted)
            await self.queues.renew_leases(adopted)
        if settle and settlements:
            await self._settle_adopted(session, settlements)
        return len(adopted)

    def _standing(
        self, session: Session, task_id: str, fact: LeaseFact | None, holder: Session | None
    ) -> LeaseFact | None:
        """The lease of a claim that may still be adopted (in Redis under the claimed lease number, held by no stream
        here), or None: a claim that does not stand is dropped (and counted)."""
        claim = session.claims[task_id]
        if fact is None or fact.entry.attempt != lease_number(claim.token):
            session.drop_claim(task_id, gone=True)
            self.reconnect_leases["gone"] += 1
            if claim.settlement is not None:
                self.reannounced_gone += 1
            return None
        if holder is not None:
            session.drop_claim(task_id)
            if holder is not session:
                self.reconnect_leases["refused"] += 1
            return None
        return fact

    async def _settle_adopted(self, session: Session, settlements: list[Settlement]) -> None:
        """The acks, then the nacks, that waited for their leases to be adopted."""
        acks = [a for a in settlements if isinstance(a, scheduler_pb2.Ack)]
        nacks = [n for n in settlements if isinstance(n, scheduler_pb2.Nack)]
        self.reconnect_leases["acked"] += len(acks)
        self.reconnect_leases["nacked"] += len(nacks)
        if acks:
            await self._ack(session, acks)
        if nacks:
            await self._nack(session, nacks)

    async def _adopt_later(self, session: Session) -> None:
        """Looks at the waiting claims again until each is adopted or gone (a lease runs out at the latest)."""
        interval_s = max(0.05, self.queues.settings.housekeeping_interval_s / 2)
        while session.claims and not session.closed:
            await asyncio.sleep(interval_s)
            try:
                adopted = await self._try_claims(session)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("worker %s: re-announced leases not checked: %s", session.worker_id, exc)
                continue
            if adopted:
                log.info(
                    "worker %s: %d more re-announced leases adopted",
                    session.worker_id,
                    adopted,
                    extra={"worker": session.worker_id},
                )
        self._adopting.pop(session, None)


__all__ = ["PullStreams", "hello_problem"]
