"""Periodic jobs with status: a server's chores, registered with their interval, run on it, and shown to operators.

A `Jobs` registry holds the periodic jobs of one server: the scheduler's housekeeping tick, expired sweep,
watermark record, reconciliation and retention; a worker's lexicon check and OCR engine health probe (README
"Periodic jobs"). `Jobs.run` runs each job in a loop of its own: a run, a wait of the job's interval (jittered
where the job asks for it), the next run. The interval is counted from the end of one run to the start of the
next, so the runs of one job never overlap and a slow run delays the next one instead of piling runs up. A run
that raises is logged, counted as an error, and the job keeps its schedule: the next run comes an interval
later, as after a run that succeeded. A run may have a time limit (`timeout_s`): past it the run is cancelled
and counted as an error.

`run_now(name)` runs a job at once, or, while a run of it is in progress, waits for that run; either way it
answers that run's `Outcome` (the operators' RunJob, sieve/rpc/jobs.py). The caller stopping to wait does not
stop the run. `trigger(name)` asks for a run as soon as possible and returns at once: the loop's wait ends, or,
while a run is in progress, another follows it (a worker's lexicon NOTIFY, which a run already reading the old
version must not swallow).

Each job's `JobStatus` (interval, last start and finish, duration, error or result, runs, errors, next run,
running now) is what ListJobs shows. Runs are counted in Prometheus as well: `sieve_job_runs{job,outcome}` and
`sieve_job_seconds{job}` (sieve/observe/metrics.py).

The server shape (sieve/rpc/server.py) starts `run` with a service's background loops and cancels it with them at
shutdown: the loops end, and so do the runs in progress (waited for at most STOP_WAIT_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sieve.observe import metrics

log = logging.getLogger("sieve.jobs")

#: what a job runs: a coroutine function; what it returns (None, a count, a report) is kept as its result text
JobFn = Callable[[], Awaitable[object]]

#: longest the runner waits at shutdown for the runs it cancelled to end
STOP_WAIT_S = 5.0
#: longest result or error text kept per job
MAX_TEXT_CHARS = 500


class UnknownJob(KeyError):
    """No job of that name is registered."""


@dataclass(slots=True)
class JobStatus:
    """One job's schedule and the outcome of its runs so far (a copy: `Jobs.status` hands out snapshots)."""

    name: str
    description: str
    #: seconds from the end of one run to the start of the next (before jitter)
    interval_s: float
    last_started_at: datetime | None = None
    last_finished_at: datetime | None = None
    last_duration_s: float | None = None
    #: the error of the last finished run ("" when it succeeded)
    last_error: str = ""
    #: what the last successful run returned, as text ("" for None)
    last_result: str = ""
    #: finished runs, scheduled and on demand; how many of them failed; failures in a row up to the last run
    runs: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    #: when the next scheduled run starts (None while one runs, or while the loops do not run)
    next_run_at: datetime | None = None
    running: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one run went."""

    succeeded: bool
    result: str = ""
    error: str = ""
    duration_s: float = 0.0


class _Job:
    """A registered job: what to run and how often, its status, and its run in progress."""

    __slots__ = ("current", "first_run_s", "fn", "jitter", "status", "timeout_s", "wake")

    def __init__(
        self,
        status: JobStatus,
        fn: JobFn,
        *,
        first_run_s: float,
        jitter: float,
        timeout_s: float | None,
    ) -> None:
        self.status = status
        self.fn = fn
        self.first_run_s = first_run_s
        self.jitter = jitter
        self.timeout_s = timeout_s
        #: set by trigger(): the loop's wait ends (or the next one does not start)
        self.wake = asyncio.Event()
        self.current: asyncio.Task[Outcome] | None = None

    @property
    def busy(self) -> bool:
        return self.current is not None and not self.current.done()


def _now() -> datetime:
    return datetime.now(UTC)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return _clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class Jobs:
    """The periodic jobs of one server (see the module): `register` them, `run` runs them on their intervals,
    `statuses` shows them, `run_now` and `trigger` run one out of turn."""

    def __init__(self, replica: str = "", *, rng: random.Random | None = None) -> None:
        #: whose jobs these are (a scheduler replica's id, a worker's id; ListJobs shows it)
        self.replica = replica
        self._jobs: dict[str, _Job] = {}
        self._rng = rng or random.Random()
        self._running = False

    # --- the registry ------------------------------------------------------------------------------
    def register(
        self,
        name: str,
        interval_s: float,
        fn: JobFn,
        description: str,
        *,
        first_run_s: float = 0.0,
        jitter: float = 0.0,
        timeout_s: float | None = None,
    ) -> None:
        """Adds a job: `fn` runs every `interval_s` (from the end of one run to the start of the next), first
        `first_run_s` after `run` starts (0: at once); `jitter` (0 <= j < 1) varies each wait by up to that
        fraction of the interval either way; a run longer than `timeout_s` is cancelled and counted as failed.
        Register jobs before `run` starts (a job registered later runs on demand only)."""
        if not name or name in self._jobs:
            raise ValueError(f"job name {name!r} is empty or taken")
        if not (0 < interval_s < math.inf) or first_run_s < 0 or not 0 <= jitter < 1:
            raise ValueError(f"job {name}: interval_s must be positive, first_run_s not negative, 0 <= jitter < 1")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"job {name}: timeout_s must be positive")
        status = JobStatus(name=name, description=description, interval_s=interval_s)
        self._jobs[name] = _Job(status, fn, first_run_s=first_run_s, jitter=jitter, timeout_s=timeout_s)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def names(self) -> list[str]:
        return list(self._jobs)

    def status(self, name: str) -> JobStatus:
        """A snapshot of one job's status; UnknownJob when there is none of that name."""
        return dataclasses.replace(self._job(name).status)

    def statuses(self) -> list[JobStatus]:
        """Snapshots of every job's status, in the order they were registered."""
        return [dataclasses.replace(job.status) for job in self._jobs.values()]

    def _job(self, name: str) -> _Job:
        job = self._jobs.get(name)
        if job is None:
            raise UnknownJob(name)
        return job

    # --- out of turn -------------------------------------------------------------------------------
    async def run_now(self, name: str) -> Outcome:
        """Runs the job now, or waits for its run in progress; that run's outcome. Cancelling the caller does not
        cancel the run. UnknownJob when there is no job of that name."""
        job = self._job(name)
        current = job.current if job.busy else self._start(job)
        assert current is not None
        return await asyncio.shield(current)

    def trigger(self, name: str) -> None:
        """Asks for a run as soon as possible (after the run in progress, if any); returns at once. Only while the
        loops run (see `run`)."""
        self._job(name).wake.set()

    # --- the loops ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Runs every registered job on its interval until cancelled; then cancels the runs in progress and waits
        for them (at most STOP_WAIT_S). A second call while the loops run returns at once."""
        if self._running:
            return
        self._running = True
        loops = [asyncio.create_task(self._loop(job), name=f"job-{job.status.name}") for job in self._jobs.values()]
        try:
            await asyncio.gather(*loops)
        finally:
            self._running = False
            runs = [job.current for job in self._jobs.values() if job.current is not None and not job.current.done()]
            pending = [*loops, *runs]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=STOP_WAIT_S)
            for job in self._jobs.values():
                job.status.next_run_at = None

    async def _loop(self, job: _Job) -> None:
        delay = job.first_run_s
        while True:
            if delay > 0 and not job.wake.is_set():
                job.status.next_run_at = _now() + timedelta(seconds=delay)
                # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancel that comes as the event is set
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await job.wake.wait()
            job.wake.clear()
            job.status.next_run_at = None
            # never two runs at once: a run started on demand meanwhile is waited for, then this one starts
            while job.current is not None and not job.current.done():
                await asyncio.wait({job.current})
            await self._start(job)
            delay = self._delay(job)

    def _delay(self, job: _Job) -> float:
        interval = job.status.interval_s
        if not job.jitter:
            return interval
        return interval * (1 + self._rng.uniform(-job.jitter, job.jitter))

    def _start(self, job: _Job) -> asyncio.Task[Outcome]:
        job.current = asyncio.create_task(self._execute(job), name=f"job-run-{job.status.name}")
        return job.current

    async def _execute(self, job: _Job) -> Outcome:
        status = job.status
        status.running = True
        status.last_started_at = _now()
        began = time.perf_counter()
        limit = asyncio.timeout(job.timeout_s)
        try:
            async with limit:
                value = await job.fn()
        except asyncio.CancelledError:  # shutdown: neither a run nor an error
            status.running = False
            raise
        except Exception as exc:
            error = f"timed out after {job.timeout_s:g} s" if limit.expired() else _describe(exc)
            outcome = Outcome(False, error=error, duration_s=time.perf_counter() - began)
            log.error("job %s failed: %s", status.name, outcome.error, exc_info=exc, extra={"job": status.name})
        else:
            result = "" if value is None else _clip(str(value))
            outcome = Outcome(True, result=result, duration_s=time.perf_counter() - began)
        self._record(status, outcome)
        return outcome

    @staticmethod
    def _record(status: JobStatus, outcome: Outcome) -> None:
        status.running = False
        status.last_finished_at = _now()
        status.last_duration_s = outcome.duration_s
        status.runs += 1
        status.last_error = outcome.error
        if outcome.succeeded:
            status.last_result = outcome.result
            status.consecutive_errors = 0
        else:
            status.errors += 1
            status.consecutive_errors += 1
        metrics.JOB_RUNS.labels(job=status.name, outcome="ok" if outcome.succeeded else "error").inc()
        metrics.JOB_SECONDS.labels(job=status.name).observe(outcome.duration_s)


__all__ = ["STOP_WAIT_S", "JobFn", "JobStatus", "Jobs", "Outcome", "UnknownJob"]
