"""The external engine (design 004's Async Engine) as a worker role: EXTERNAL hand-outs in, acks and nacks out.

The scheduler hands an EXTERNAL task to the engine like any task to a worker — fair per device and caller, with
priorities, aging, TTL, backoff and dead letters — and the engine's credits are the free slots of its providers'
first pools (`credit_limit`): a pending job leaves its device queue only when it is its turn AND a slot is free.
Each hand-out then runs on its own (`run_one`), stage by stage (`states.plan`):

1. take the stage's slot (`SlotPools.acquire`, holder "task:stage:attempt"; a job that finds its pool full waits
   in the engine, first come first served, and is served as soon as a slot frees);
2. record the submit intent, POST with `Idempotency-Key` = the holder (transient errors and 429: retried with
   backoff while the slot is held), record the provider's job id — only then is the submit done;
3. the tick polls it (below); when it is terminal the slot is released at once, in the tick;
4. after the last stage: the output is downloaded and stored as the task's result WITHOUT a slot, then acked.

The tick (`run`): every `external_tick_s` (at least `external_tick_rest_s` of rest after a long one) each
submitted job due (no sooner than its provider's poll_interval_s after its last poll) is polled once, all in
parallel under one semaphore (`external_concurrency`); slots of jobs that ended are released and waiting jobs
served in the same tick; held slots' leases are renewed; the pools' free counts are read again (other replicas).

A stage's deadline is its provider's timeout_s from the stage's first submit intent (recorded, so a restart does
not extend it): past it the stage fails. A failed stage (provider said failed, deadline, a permanent error) is
recorded and the task nacked with its attempt counted: the scheduler retries it with backoff and dead-letters it at
its max attempts; the next attempt submits that stage again under its own key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC

from opentelemetry import trace

from sieve.backoff import Backoff
from sieve.db.external_jobs import FAILED, SUCCEEDED, ExternalJobStore, JobRow
from sieve.db.tasks import Started, TaskStore
from sieve.external_config import ExternalConfig, ProviderConfig, StageConfig
from sieve.observe import metrics, telemetry
from sieve.redis.leases import lease_number
from sieve.redis.slot_pools import SlotPools
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2
from worker_svc.external import states
from worker_svc.external.handlers import Handler, Polled, ProviderError, StageJob
from worker_svc.external.output import outcome_of

log = logging.getLogger("sieve.worker.external")

#: a poll is due this fraction of its provider's poll_interval_s after the last (ticks are not exactly on time)
DUE_FRACTION = 0.9
#: how often waiting jobs look for a slot freed by another replica, between ticks (s, at most)
REFILL_S = 0.5


class StageFailed(Exception):
    """A stage that cannot succeed in this attempt (the provider failed it, its deadline passed, a permanent
    error); the task is handed back counted."""

    def __init__(self, reason: str, outcome: str) -> None:
        super().__init__(reason)
        self.outcome = outcome


@dataclass(eq=False)
class Watched:
    """A submitted provider job the tick polls, until it ends."""

    provider: ProviderConfig
    stage: StageConfig
    handler: Handler
    job_id: str
    holder: str
    deadline: float  # time.time()
    submitted: float  # time.monotonic()
    span: trace.Span
    last_poll: float = field(default_factory=time.monotonic)
    polls: int = 0
    done: asyncio.Future[Polled] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ExternalEngine:
    """Runs EXTERNAL hand-outs (see the module): `__call__` is the Puller's batch runner, `run` the tick loop,
    `credit_limit` the credits it may grant."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        tasks: TaskStore,
        jobs: ExternalJobStore,
        pools: SlotPools,
        handlers: dict[str, Handler],
    ) -> None:
        self.settings = settings
        self.config: ExternalConfig = settings.external
        self.worker_id = worker_id
        self.tasks = tasks
        self.jobs = jobs
        self.pools = pools
        self.handlers = handlers
        self.tick_s = settings.external_tick_s
        self._limit = asyncio.Semaphore(settings.external_concurrency)
        #: pool -> free slots as last known (read each tick, kept up to date by this engine's acquires/releases)
        self.free: dict[str, int] = dict(self.config.pools)
        #: pool -> holders of this engine (renewed each tick) -> when taken (monotonic)
        self.held: dict[str, dict[str, float]] = {p: {} for p in self.config.pools}
        #: pool -> jobs waiting for a slot, first come first served
        self.waiting: dict[str, deque[tuple[str, asyncio.Future[None]]]] = {p: deque() for p in self.config.pools}
        self.watching: dict[str, Watched] = {}
        self._refilling = {p: asyncio.Lock() for p in self.config.pools}
        #: pool -> stages started by an engine that died, waiting to be handed out again (they take their own slot
        #: back: credits beyond the free slots, so that a restart does not wait for their leases to run out)
        self.orphans: dict[str, int] = {}
        #: tasks handed out to this engine that neither hold nor wait for a slot yet (their credit is spent)
        self._starting: set[str] = set()
        self._refill_now = asyncio.Event()
        self.ticks = 0
        self.polls = 0
        #: called when a slot may have become free (the Puller grants the credit at once)
        self.on_slot_freed: Callable[[], None] = lambda: None
        for pool, maximum in self.config.pools.items():
            metrics.SLOTS_MAX.labels(pool=pool).set(maximum)

    # --- credits ------------------------------------------------------------------------------------
    def credit_limit(self) -> int:
        """Hand-outs the engine may take now: the free slots of its providers' first pools, less the jobs already
        waiting for one (another replica may grant the same slot: the acquire decides, the loser waits)."""
        free = sum(
            max(0, self.free[p] + self.orphans.get(p, 0) - len(self.waiting[p])) for p in self.config.first_pools
        )
        return max(0, free - len(self._starting))

    # --- slots --------------------------------------------------------------------------------------
    async def _acquire(self, pool: str, holder: str) -> bool:
        self._starting.discard(holder.split(":", 1)[0])
        if not await self.pools.acquire(pool, holder):
            self.free[pool] = 0
            return False
        if holder not in self.held[pool]:
            self.held[pool][holder] = time.monotonic()
            self.free[pool] = max(0, self.free[pool] - 1)
        return True

    async def take_slot(self, pool: str, holder: str) -> None:
        """Holds a slot of `pool` for `holder`, waiting in line while the pool is full."""
        if not self.waiting[pool] and await self._acquire(pool, holder):
            return
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[pool].append((holder, ready))
        try:
            await ready
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self.waiting[pool].remove((holder, ready))
            raise

    async def release(self, pool: str, holder: str) -> None:
        """Gives the slot back (if held) and serves the jobs waiting for one."""
        if await self._give_back(pool, holder):
            await self.refill(pool)
            self.on_slot_freed()

    async def _give_back(self, pool: str, holder: str) -> bool:
        taken = self.held[pool].pop(holder, None)
        if taken is None:
            return False
        metrics.SLOT_BUSY_SECONDS.labels(pool=pool).inc(time.monotonic() - taken)
        try:
            await self.pools.release(pool, holder)
        except Exception:  # the lease runs out by itself
            log.warning("slot %s of %s not released (its lease will expire)", holder, pool, exc_info=True)
        self.free[pool] = min(self.config.pools[pool], self.free[pool] + 1)
        return True

    async def refill(self, pool: str) -> None:
        """Serves waiting jobs of `pool`, in order, while slots are free (one refill of a pool at a time)."""
        line = self.waiting[pool]
        async with self._refilling[pool]:
            while line:
                holder, ready = line[0]
                if ready.done():  # cancelled while waiting
                    line.popleft()
                    continue
                if not await self._acquire(pool, holder):
                    return
                line.popleft()
                if ready.done():  # cancelled meanwhile: the slot it was given goes back
                    await self._give_back(pool, holder)
                    continue
                ready.set_result(None)

    # --- one hand-out -------------------------------------------------------------------------------
    async def __call__(
        self, assignments: list[scheduler_pb2.Assignment]
    ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        settled = await asyncio.gather(*(self.run_one(a) for a in assignments))
        return [s for s in settled if isinstance(s, scheduler_pb2.Ack)], [
            s for s in settled if isinstance(s, scheduler_pb2.Nack)
        ]

    async def run_one(self, a: scheduler_pb2.Assignment) -> scheduler_pb2.Ack | scheduler_pb2.Nack:
        task_id = uuid.UUID(a.task_id)
        self._starting.add(str(task_id))
        try:
            return await self._run_one(a, task_id)
        finally:
            self._starting.discard(str(task_id))

    async def _run_one(self, a: scheduler_pb2.Assignment, task_id: uuid.UUID) -> scheduler_pb2.Ack | scheduler_pb2.Nack:
        lease = lease_number(a.lease_token)
        marked = await self.tasks.start(self.worker_id, [(task_id, lease, a.attempt, a.assigned_at.ToDatetime(UTC))])
        if not marked:  # finished, cancelled or handed out again since: the ack clears a lease still ours
            return scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token)
        started = marked[0]
        began = time.monotonic()
        with telemetry.tracer().start_as_current_span(
            "external job", context=telemetry.context_from(started.trace_context or "")
        ) as span:
            span.set_attribute("sieve.task_id", a.task_id)
            try:
                provider, input_json = self._job_of(started)
                span.set_attribute("sieve.external.provider", provider.name)
                await self._stages(task_id, a.attempt, provider, input_json, span)
                stored = await self._finish(started, provider, began)
            except StageFailed as exc:
                span.set_attribute("sieve.external.outcome", exc.outcome)
                metrics.EXTERNAL_JOBS.labels(_provider_label(started), exc.outcome).inc()
                return scheduler_pb2.Nack(
                    task_id=a.task_id, lease_token=a.lease_token, reason=str(exc)[:500], count_attempt=True
                )
            except Exception as exc:  # PostgreSQL, Redis: may pass
                log.exception("external job %s failed", a.task_id, extra={"task_id": a.task_id})
                return scheduler_pb2.Nack(
                    task_id=a.task_id,
                    lease_token=a.lease_token,
                    reason=f"engine error: {type(exc).__name__}: {exc}"[:500],
                    count_attempt=True,
                )
            span.set_attribute("sieve.external.outcome", "completed" if stored else "refused")
        return scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token)

    def _job_of(self, started: Started) -> tuple[ProviderConfig, str]:
        try:
            job = json.loads(started.text or "")
            provider = self.config.get(str(job["provider"]))
            input_json = str(job["input_json"])
        except (ValueError, KeyError, TypeError):
            raise StageFailed("external task without a readable job", "error") from None
        if provider is None:
            raise StageFailed(f"provider {job['provider']!r} is not configured on this engine", "error")
        return provider, input_json

    async def _stages(
        self, task_id: uuid.UUID, attempt: int, provider: ProviderConfig, input_json: str, span: trace.Span
    ) -> None:
        """Runs the stages not done yet, in order (`states.plan` on what is recorded)."""
        names = [s.name for s in provider.stages]
        while True:
            rows = {r.stage: r for r in await self.jobs.of_task(task_id)}
            step = states.plan(names, rows, attempt)
            span.add_event("state", {"state": states.label(names, rows)})
            if step.action == states.FINISH:
                return
            stage = provider.stages[step.index]
            if step.action == states.FAIL:
                raise StageFailed(f"{stage.name}: {rows[stage.name].error or 'failed'}", "failed")
            row = await self.jobs.begin(
                task_id, stage.name, step.index, provider.name, stage.pool, f"{task_id}:{stage.name}:{attempt}", attempt
            )
            previous = {s.name: rows[s.name].result_url or "" for s in provider.stages[: step.index]}
            await self._stage(provider, stage, row, StageJob(row.holder, stage.name, input_json, previous), span)

    async def _stage(
        self, provider: ProviderConfig, stage: StageConfig, row: JobRow, job: StageJob, span: trace.Span
    ) -> None:
        handler = self.handlers[provider.name]
        deadline = row.created_at.timestamp() + provider.timeout_s
        if row.provider_job_id is None:
            await self.take_slot(stage.pool, row.holder)
        elif not await self._acquire(stage.pool, row.holder):  # resumed: the job runs at the provider anyway
            log.warning("resumed job %s polls without a slot of %s (the pool is full)", row.holder, stage.pool)
        polls = 0
        keep_slot = False  # cancelled (the process stops): the job goes on at the provider, the next engine resumes it
        try:
            job_id = row.provider_job_id or await self._submit(handler, provider, row, job, deadline, span)
            watched = Watched(
                provider, stage, handler, job_id, row.holder, deadline, time.monotonic(), trace.get_current_span()
            )
            self.watching[row.holder] = watched
            try:
                polled = await watched.done
            finally:
                self.watching.pop(row.holder, None)
                polls = watched.polls
        except StageFailed as exc:
            await self.jobs.terminal(
                row.task_id, row.stage, row.holder, state=FAILED, polls=polls, cost=0.0, error=str(exc)
            )
            raise
        except asyncio.CancelledError:
            keep_slot = True
            raise
        finally:
            if not keep_slot:
                await self.release(stage.pool, row.holder)
        metrics.EXTERNAL_POLLS.labels(provider.name).observe(polls)
        cost = provider.cost_per_job
        if polled.status == SUCCEEDED:
            await self.jobs.terminal(
                row.task_id,
                row.stage,
                row.holder,
                state=SUCCEEDED,
                polls=polls,
                cost=cost,
                result_url=polled.result_url,
            )
            return
        await self.jobs.terminal(
            row.task_id, row.stage, row.holder, state=FAILED, polls=polls, cost=cost, error=polled.error or "failed"
        )
        raise StageFailed(f"{provider.name} failed {stage.name}: {polled.error or 'no reason given'}", "failed")

    async def _submit(
        self, handler: Handler, provider: ProviderConfig, row: JobRow, job: StageJob, deadline: float, span: trace.Span
    ) -> str:
        """POSTs the stage (retrying what may pass, 429 included, until its deadline) and records the job id."""
        backoff = Backoff(base_s=min(0.2, self.tick_s), max_s=max(self.tick_s, 1.0))
        with telemetry.tracer().start_as_current_span("external submit") as submit_span:
            submit_span.set_attribute("sieve.external.stage", job.stage)
            while True:
                began = time.perf_counter()
                try:
                    async with self._limit:
                        job_id = await handler.submit(job)
                    break
                except ProviderError as exc:
                    kind = "transient" if exc.transient else "permanent"
                    metrics.EXTERNAL_REQUEST_ERRORS.labels(provider.name, "submit", kind).inc()
                    if not exc.transient:
                        raise StageFailed(f"{provider.name} refused {job.stage}: {exc}", "error") from None
                    wait_s = backoff.next()
                    if time.time() + wait_s > deadline:
                        raise StageFailed(
                            f"{job.stage}: deadline passed while submitting ({exc})", "deadline"
                        ) from None
                    submit_span.add_event("retry", {"error": str(exc)})
                    await asyncio.sleep(wait_s)
                finally:
                    metrics.EXTERNAL_REQUEST_SECONDS.labels(provider.name, "submit").observe(
                        time.perf_counter() - began
                    )
            submit_span.set_attribute("sieve.external.job_id", job_id)
        await self.jobs.submitted(row.task_id, row.stage, row.holder, job_id)
        metrics.EXTERNAL_COST.labels(provider.name, row.caller).inc(provider.cost_per_job)
        span.add_event("submitted", {"stage": job.stage, "job_id": job_id})
        return job_id

    async def _finish(self, started: Started, provider: ProviderConfig, began: float) -> bool:
        """Downloads the last stage's output and stores it as the task's result (no slot held); True if stored."""
        rows = await self.jobs.of_task(started.task_id)
        last = rows[-1]
        with telemetry.tracer().start_as_current_span("external finish"):
            backoff = Backoff(base_s=0.2, max_s=max(self.tick_s, 1.0))
            deadline = time.time() + provider.timeout_s
            while True:
                t0 = time.perf_counter()
                try:
                    async with self._limit:
                        output = await self.handlers[provider.name].finish(last.result_url or "")
                    break
                except ProviderError as exc:
                    kind = "transient" if exc.transient else "permanent"
                    metrics.EXTERNAL_REQUEST_ERRORS.labels(provider.name, "result", kind).inc()
                    if not exc.transient or time.time() > deadline:
                        raise StageFailed(f"{provider.name}: {exc}", "error") from None
                    await asyncio.sleep(backoff.next())
                finally:
                    metrics.EXTERNAL_REQUEST_SECONDS.labels(provider.name, "result").observe(time.perf_counter() - t0)
            outcome = outcome_of(started, self.worker_id, provider, rows, output, time.monotonic() - began)
            if isinstance(outcome, str):
                raise StageFailed(outcome, "error")
            stored = bool(await self.tasks.finish([outcome]))
        await self.jobs.completed(started.task_id)
        metrics.EXTERNAL_JOBS.labels(provider.name, "completed").inc()
        return stored

    # --- the tick -----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Ticks until `stop`; a second loop serves waiting jobs between ticks (slots freed by other replicas)."""
        refiller = asyncio.create_task(self._refill_loop(stop))
        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    await self.tick()
                except Exception:
                    log.exception("external tick failed")
                rest = max(self.tick_s - (time.monotonic() - began), self.settings.external_tick_rest_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), rest)
        finally:
            refiller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refiller

    async def _refill_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(REFILL_S, self.tick_s))
            for pool, line in self.waiting.items():
                if line:
                    try:
                        await self.refill(pool)
                    except Exception:
                        log.warning("refill of %s failed", pool, exc_info=True)

    async def tick(self) -> None:
        """Polls the jobs due, releases the slots of those that ended, renews leases, reads the pools again and
        serves waiting jobs."""
        self.ticks += 1
        now = time.monotonic()
        due = [w for w in self.watching.values() if now - w.last_poll >= w.provider.poll_interval_s * DUE_FRACTION]
        await asyncio.gather(*(self._poll(w) for w in due))
        await self._renew()
        self.orphans = await self.jobs.orphans()
        if self.ticks % 10 == 1:  # finishes that stored their result and died before marking it
            await self.jobs.completed()
        for state in await self.pools.states():
            mine_waiting = len(self.waiting[state.name])
            self.free[state.name] = max(0, state.max_slots - state.in_use) if state.name in self.free else 0
            if mine_waiting and self.free[state.name]:
                await self.refill(state.name)

    async def _poll(self, w: Watched) -> None:
        if w.done.done():
            return
        if time.time() > w.deadline:
            await self.release(w.stage.pool, w.holder)
            w.done.set_exception(StageFailed(f"{w.stage.name}: deadline passed at {w.provider.name}", "deadline"))
            return
        began = time.perf_counter()
        try:
            async with self._limit:
                polled = await w.handler.poll(w.job_id)
        except ProviderError as exc:
            kind = "transient" if exc.transient else "permanent"
            metrics.EXTERNAL_REQUEST_ERRORS.labels(w.provider.name, "poll", kind).inc()
            w.span.add_event("poll", {"error": str(exc)})
            if exc.transient:  # polled again next tick: no retry storm
                return
            polled = Polled("failed", error=str(exc))
        finally:
            w.polls += 1
            self.polls += 1
            w.last_poll = time.monotonic()
            metrics.EXTERNAL_REQUEST_SECONDS.labels(w.provider.name, "poll").observe(time.perf_counter() - began)
        w.span.add_event("poll", {"status": polled.status, "stage": w.stage.name})
        if polled.terminal and not w.done.done():
            metrics.EXTERNAL_JOB_SECONDS.labels(w.provider.name, w.stage.name).observe(time.monotonic() - w.submitted)
            await self.release(w.stage.pool, w.holder)  # at once: the next job may take it in this tick
            w.done.set_result(polled)

    async def _renew(self) -> None:
        for pool, holders in self.held.items():
            if not holders:
                continue
            lost = await self.pools.renew(pool, list(holders))
            for holder in lost:  # its lease ran out (the engine stalled): taken again if the pool has room
                log.warning("slot of %s in %s had expired; taking it again", holder, pool)
                if not await self.pools.acquire(pool, holder):
                    log.warning("slot of %s in %s lost: the pool is full", holder, pool)


def _provider_label(started: Started) -> str:
    try:
        return str(json.loads(started.text or "")["provider"])[:63]
    except (ValueError, KeyError, TypeError):
        return "?"
