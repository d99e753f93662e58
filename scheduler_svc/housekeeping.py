"""The periodic tick, off the hot path: resume devices whose backoff ended, take back leases that ran out, renew
leases of tasks live workers still hold, free devices whose dispatcher died; and the replica's other chores.

The chores are periodic jobs of the replica (sieve/jobs.py, registered by `register_jobs`; ListJobs / RunJob show
and run them): `housekeeping` (the tick, every `housekeeping_interval_s`), `expired-sweep` (PENDING tasks past
their TTL, every `ttl_sweep_interval_s`), `watermark` (the record for autoscalers, every `watermark_interval_s`),
`reconcile` (scheduler_svc/reconcile.py: a pass when this replica gets the turn, tried every `Reconciler.poll_s`)
and `retention` (sieve/db/retention.py, every `retention_check_interval_s`, when `retention_in_scheduler`). Each
runs in a loop of its own, so a failing one (logged and counted) neither stops nor delays the others; the tick's
steps keep their order within it.

Housekeeping sees the rest of its replica only through narrow parts: the stores it sweeps (`HousekeepingStores`),
the board of sessions, the one take-back path (`Returns`), and `ReplicaHooks` — wake the dispatch loop, tell routing
which workers are alive, end a session, rebuild Redis, publish the watermark.

Execution timeouts: a hand-out held by one of this replica's streams for longer than its type's timeout plus
`execution_timeout_grace_s` is taken back even while the stream is alive (its attempt counted, with the retry
backoff; dead-lettered at the task's max attempts); the worker's later ack or result is refused by fencing.

Scheduler replicas gone: each replica says it is alive (`SchedulerState.say_alive`) every ALIVE_EVERY_S, in a loop
of its own. A replica silent for `scheduler_dead_after_s` (and for longer than its workers need to reconnect and
re-announce their leases to another replica) is gone: the leases it had handed out that nobody adopted — tasks
that were on their way to a worker when it died — go back to their queues at once, uncounted, instead of waiting
for the lease TTL. Which leases: those whose deadline is no later than the dead replica's last sign of life plus
the lease TTL (leases of live replicas' live workers are renewed past that every tick).

Shards (`redis_shards` > 1): the replicas divide the shards by renewable leases (`sieve/redis/shard_leases.py`),
renewed in the same loop as the sign of life; the sweeps of the tick that are about one shard's keys (backoff
resumed, delayed tasks promoted, expired leases reclaimed, devices whose dispatcher died freed) cover the shards
this replica holds. What is global stays with whoever takes it: a dead replica's orphans (whichever replica
forgets it first, in every shard), the reconciliation pass (its turn key, over every shard), the TTL sweep and the
leases of this replica's own workers (renewed in every shard).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import asyncpg

from scheduler_svc.board import Board
from scheduler_svc.lifecycle import Returned, Returns
from scheduler_svc.reconcile import Reconciler
from scheduler_svc.sessions import Session
from sieve.backoff import compute_backoff
from sieve.db.retention import Retention
from sieve.db.stats import fold as fold_stats
from sieve.db.tasks import TaskStore
from sieve.enums import enum_label
from sieve.jobs import Jobs
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.redis.scheduler_state import SchedulerState
from sieve.redis.shard_leases import ShardLeases
from sieve.redis.worker_records import WorkerRecord, WorkerRecords
from sieve.v1.types_pb2 import TaskType

log = logging.getLogger("sieve.scheduler.housekeeping")

#: how often a replica says it is alive (s)
ALIVE_EVERY_S = 0.5
#: leases of a dead replica looked at per round trip, and pages per tick at most
ORPHAN_PAGE = 1000
MAX_ORPHAN_PAGES = 100


@dataclass(frozen=True)
class HousekeepingStores:
    """What housekeeping reads and sweeps: the queues, the replicas' shared state, the task rows and the registry's
    worker records."""

    queues: QueueStore
    state: SchedulerState
    tasks: TaskStore
    records: WorkerRecords


@dataclass(frozen=True)
class ReplicaHooks:
    """What housekeeping may do to the rest of its replica, and nothing more."""

    #: this replica's id among the replicas' signs of life (the one its drain rate is published under)
    replica: str
    #: wakes the dispatch loop (work became ready, or came back)
    wake: Callable[[], None]
    #: tells routing which workers the registry shows alive (whether GPU workers are alive or expected)
    observe_workers: Callable[[Iterable[WorkerRecord]], Awaitable[None]]
    #: ends a session (what it held goes back), with the reason
    end_session: Callable[[Session, str], Awaitable[None]]
    #: rebuilds Redis from PostgreSQL when it lost its memory; True when it did
    rebuild: Callable[[], Awaitable[bool]]
    #: publishes the watermark record
    publish_watermark: Callable[[], Awaitable[object]]


class Housekeeping:
    """Owns the replica's periodic chores (see the module): the tick and the other jobs it registers, and the
    replica's sign of life (`run`); counts what it took back."""

    def __init__(self, stores: HousekeepingStores, board: Board, returns: Returns, hooks: ReplicaHooks) -> None:
        self.queues = stores.queues
        self.state = stores.state
        self.tasks = stores.tasks
        self.records = stores.records
        self.board = board
        self.returns = returns
        self.hooks = hooks
        self.settings = stores.queues.settings
        self.lease_reclaims = 0
        self._missing_since: dict[Session, float] = {}
        self.expired_swept = 0
        #: PostgreSQL's open tasks against Redis, in a loop of its own (a pass may take longer than a tick)
        self.reconciler = Reconciler(self.queues, self.tasks)
        self.replica = hooks.replica
        #: when `run` began, that is when this replica started serving (its jobs start with it): a dead replica's
        #: workers can re-announce their leases here only from then on (None before)
        self._serving_since: float | None = None
        #: hand-outs taken back for running past their execution timeout, by task type name
        self.execution_timeouts: dict[str, int] = {}
        #: leases of dead scheduler replicas put back
        self.orphans_put_back = 0
        #: partitions ahead and old days dropped (sieve/db/retention.py): the `retention` job
        self.retention = Retention(self.tasks.pool, self.settings)
        #: the shards this replica sweeps (all of them with one shard)
        self.shard_leases = ShardLeases(
            self.queues.redis,
            self.queues.keys,
            self.queues.shards,
            self.replica,
            int(self.settings.shard_lease_ttl_s * 1000),
        )

    def register_jobs(self, jobs: Jobs) -> None:
        """The replica's periodic jobs (see the module), in the order ListJobs shows them."""
        s = self.settings
        jobs.register(
            "housekeeping",
            s.housekeeping_interval_s,
            self.tick,
            "the tick: rebuild Redis if it lost its memory, resume backed-off devices and promote delayed tasks, "
            "renew live leases, take back expired and timed-out ones and dead replicas' orphans, free abandoned "
            "devices, end sessions of workers gone from the registry",
        )
        jobs.register(
            "expired-sweep",
            s.ttl_sweep_interval_s,
            self._sweep_expired_job,
            "PENDING tasks past their TTL leave their queues and become EXPIRED",
        )
        jobs.register(
            "watermark",
            s.watermark_interval_s,
            self.hooks.publish_watermark,
            "publishes the watermark record for autoscalers (pending, active devices, live workers) with its TTL",
        )
        jobs.register(
            "reconcile",
            self.reconciler.poll_s,
            self.reconciler.take_turn,
            "when this replica gets the reconciliation turn (one pass per interval among the replicas): every "
            "open task of PostgreSQL is found in Redis or queued again",
        )
        jobs.register(
            "stats-fold",
            s.stats_fold_interval_s,
            self._fold_stats_job,
            "folds the tasks that became final since the last fold into GetStats' rollups (from the change feed)",
        )
        if s.retention_in_scheduler:
            jobs.register(
                "retention",
                s.retention_check_interval_s,
                self._retention_job,
                "makes the day partitions ahead and drops or deletes what is past SIEVE_RETENTION_DAYS",
                jitter=0.1,
            )

    async def run(self) -> None:
        """This replica's sign of life (and its shard leases, several shards) from when it starts serving, until
        cancelled; the periodic chores are jobs (`register_jobs`)."""
        self._serving_since = time.monotonic()
        await self._say_alive()

    async def _sweep_expired_job(self) -> str:
        return f"{await self.sweep_expired()} queued tasks expired"

    async def _fold_stats_job(self) -> str:
        return f"{await fold_stats(self.tasks.pool)} changes folded"

    async def _retention_job(self) -> str:
        """One retention run (one process at a time: another one's run is not waited for)."""
        try:
            report = await self.retention.run()
        except asyncpg.InsufficientPrivilegeError as exc:
            raise PermissionError(
                f"retention needs the schema owner's rights ({exc}): run `python -m sieve.db.retention` with the "
                "owner role, or set SIEVE_RETENTION_IN_SCHEDULER=false"
            ) from exc
        if not report.ran:
            return "another process holds the retention lock"
        purged = ", ".join(
            f"{getattr(report, f.name)} {f.name.removeprefix('purged_')}"
            for f in dataclasses.fields(report)
            if f.name.startswith("purged_")
        )
        return (
            f"made {len(report.created)} day partitions, dropped {len(report.dropped)} days, kept "
            f"{len(report.kept)}, moved {report.moved} rows; deleted: {purged}"
        )

    async def _say_alive(self) -> None:
        """Keeps this replica's entry in Keys.schedulers fresh, and its shard leases (several shards); removes the
        entry and gives the leases back when stopped (an orderly stop hands back what it held itself)."""
        try:
            while True:
                try:
                    await self.state.say_alive(self.replica, int(now_ms()))
                    if self.queues.shards > 1:
                        await self.balance_shards()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.debug("could not say this replica is alive: %s", exc)
                await asyncio.sleep(ALIVE_EVERY_S)
        finally:
            with contextlib.suppress(Exception):
                await self.shard_leases.release()
            with contextlib.suppress(Exception):
                await self.state.forget_replica(self.replica)

    async def balance_shards(self) -> list[int]:
        """One step of dividing the shards (sieve/redis/shard_leases.py) among the replicas alive within a lease
        TTL; the shards this replica holds after it."""
        live = self.shard_leases.live(await self.state.replicas(), now_ms())
        before = self.shard_leases.owned
        owned = await self.shard_leases.balance(live)
        if owned != before:
            log.info(
                "replica %s holds shards %s of %d (%d replicas alive)", self.replica, owned, self.queues.shards, live
            )
        return owned

    @property
    def owned_shards(self) -> list[int]:
        """The shards this replica sweeps now."""
        return self.shard_leases.owned

    async def tick(self) -> None:
        if await self.hooks.rebuild():
            self.hooks.wake()
        now = now_ms()
        shards = self.owned_shards
        if await self.queues.resume_due(now=now, shards=shards) or await self.queues.promote_due(
            now=now, shards=shards
        ):
            self.hooks.wake()
        # leases held by this replica's live workers stay alive; the rest may run out
        await self.queues.renew_leases(self.board.live_held_task_ids(self.settings.lease_ttl_s / 2), now=now)
        await self.reclaim_expired_leases(now)
        await self.reclaim_timed_out(now)
        await self.put_back_orphans(now)
        if self.board.signer is not None:
            await self.board.signer.refresh()
        await self.free_abandoned_devices(now)
        await self.check_workers()

    async def reclaim_expired_leases(self, now: float) -> int:
        """Leases nobody renewed (their worker or scheduler died) go back to their device queues."""
        due = await self.queues.leases_due(now=now, shards=self.owned_shards)
        count = 0
        for mac, leases in due.items():
            items = []
            for task_id, lease in leases:
                holder = self.board.holder(task_id)
                worker = ""
                if holder is not None and holder.held[task_id][1] == lease:  # a silent worker of this replica
                    self.board.release(holder, task_id)
                    worker = holder.worker_id
                items.append(Returned(task_id, lease, worker))
            result = await self.returns.put_back(mac, items, counted=True, reason="lease expired")
            count += result.requeued + len(result.dead_letters)
        if count:
            self.lease_reclaims += count
            self.hooks.wake()
            log.info("reclaimed %d expired leases", count)
        return count

    async def reclaim_timed_out(self, now: float) -> int:
        """Hand-outs of this replica's streams past their type's execution timeout plus grace are taken back
        (counted, with the retry backoff), even though their stream is alive."""
        s = self.settings
        count = 0
        for session, task_id in self.board.timed_out(s.timeout_of, s.execution_timeout_grace_s):
            handed = session.handed.get(task_id)
            held = self.board.release(session, task_id)
            if held is None or handed is None:
                continue
            mac, lease = held
            type_name = enum_label(TaskType, handed.task_type)
            limit_s = s.timeout_of(type_name)
            delay_s = compute_backoff(
                handed.failures + 1, base_s=s.retry_backoff_base_s, max_s=s.retry_backoff_max_s, jitter=False
            )
            log.warning(
                "task %s ran past its execution timeout (%.0fs) on worker %s: taken back",
                task_id,
                limit_s,
                session.worker_id,
                extra={"task_id": task_id, "worker": session.worker_id},
            )
            await self.returns.put_back(
                mac,
                [Returned(task_id, lease, session.worker_id)],
                counted=True,
                reason=f"execution timed out: ran longer than {limit_s:g}s",
                retry_at_ms=now + delay_s * 1000,
                now=now,
            )
            self.execution_timeouts[type_name] = self.execution_timeouts.get(type_name, 0) + 1
            count += 1
        if count:
            self.hooks.wake()
        return count

    async def put_back_orphans(self, now: float) -> int:
        """What dead scheduler replicas had handed out and nobody adopted goes back (see the module)."""
        s = self.settings
        reconnect_s = s.worker_reconnect_max_s + 1.0
        # their workers may be re-announcing here now: they can only since this replica serves (the time it took to
        # build and rebuild before that does not count; on a loaded host it can take longer than reconnect_s)
        if self._serving_since is None or time.monotonic() - self._serving_since < reconnect_s:
            return 0
        silent_enough_s = max(
            s.scheduler_dead_after_s, 2 * s.housekeeping_interval_s + ALIVE_EVERY_S + 1.0, reconnect_s
        )
        count = 0
        for replica, raw in (await self.state.replicas()).items():
            if replica == self.replica:
                continue
            try:
                alive_ms = float(raw)
            except ValueError:
                await self.state.forget_replica(replica)
                continue
            if now - alive_ms < silent_enough_s * 1000:
                continue
            if not await self.state.forget_replica(replica):  # another replica claimed it first: it sweeps
                continue
            bound = alive_ms + (s.lease_ttl_s + ALIVE_EVERY_S + 0.5) * 1000
            put_back = await self._put_back_leases_until(bound, replica)
            log.warning(
                "scheduler replica %s is gone (silent for %.1fs): %d of its leases put back",
                replica,
                (now - alive_ms) / 1000,
                put_back,
            )
            count += put_back
        self.orphans_put_back += count
        if count:
            self.hooks.wake()
        return count

    async def _put_back_leases_until(self, bound_ms: float, replica: str) -> int:
        ours = {t for session in self.board.sessions for t in session.held} | self.board.claimed_task_ids()
        count = 0
        for shard in range(self.queues.shards):
            offset = 0
            for _ in range(MAX_ORPHAN_PAGES):
                ids = await self.state.lease_ids_until(bound_ms, offset=offset, count=ORPHAN_PAGE, shard=shard)
                if not ids:
                    break
                theirs = [t for t in ids if t not in ours]
                facts = await self.queues.lease_facts(theirs)
                # ours, and deadlines without lease data (leases_due drops those), stay in the range: page past them
                offset += len(ids) - len(facts)
                by_device: dict[str, list[Returned]] = {}
                for task_id, fact in facts.items():
                    by_device.setdefault(fact.mac, []).append(Returned(task_id, fact.entry.attempt))
                for mac, items in by_device.items():
                    result = await self.returns.put_back(
                        mac, items, counted=False, reason=f"scheduler restart: replica {replica} is gone"
                    )
                    count += result.requeued + len(result.dead_letters)
                if len(ids) < ORPHAN_PAGE:
                    break
        return count

    async def free_abandoned_devices(self, now: float) -> None:
        """Devices whose dispatcher died holding the lock are released once the lock has expired."""
        for mac in await self.state.lapsed_serving(now, count=100, shards=self.owned_shards):
            if not await self.state.device_locked(mac):
                await self.queues.release(mac, "*", now=now)
                self.hooks.wake()

    async def sweep_expired(self) -> int:
        """PENDING tasks past their TTL leave their queues and become EXPIRED (pops drop them too)."""
        count = 0
        for task_id, mac in await self.tasks.expired_pending():
            if await self.queues.remove_queued(mac, str(task_id)) is not None:
                await self.tasks.transition(
                    [task_id], "EXPIRED", "TTL passed while queued", error="expired", only_from=("PENDING",)
                )
                count += 1
        self.expired_swept += count
        if count:
            log.info("expired %d queued tasks", count)
        return count

    async def check_workers(self) -> None:
        """Reads the registry: whether a GPU worker is alive anywhere or was recently (routing), and which connected
        workers stopped heartbeating (their sessions end; what they held is handed out again)."""
        records = {r.worker_id: r for r in await self.records.list()}
        await self.hooks.observe_workers(records.values())
        now = time.monotonic()
        for session in list(self.board.sessions):
            if session.worker_id in records:
                self._missing_since.pop(session, None)
                continue
            since = self._missing_since.setdefault(session, now)
            if now - since > self.settings.worker_ttl_s:
                log.warning(
                    "worker %s has no registration for %.0fs: ending its stream",
                    session.worker_id,
                    now - since,
                    extra={"worker": session.worker_id},
                )
                self._missing_since.pop(session, None)
                await self.hooks.end_session(session, "worker gone: its registration expired")
        for session in list(self._missing_since):
            if session.closed:
                self._missing_since.pop(session, None)
