"""The periodic job runner (sieve/jobs.py): jobs run on their interval, never twice at once, run on demand and on
a trigger, and a failing job counts its errors and keeps its schedule."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest

from sieve.jobs import Jobs, UnknownJob

#: short enough for quick tests, long enough that a loaded machine does not run a job twice where once is expected
INTERVAL_S = 0.05
LONG_S = 60.0


class Counted:
    """A job body that counts its runs, can be told to fail, and can be held inside a run."""

    def __init__(self) -> None:
        self.started = 0
        self.running = 0
        self.most_at_once = 0
        self.fail = False
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self) -> str:
        self.started += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.entered.set()
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.fail:
                raise RuntimeError(f"broken on run {self.started}")
            return f"run {self.started}"
        finally:
            self.running -= 1


@contextlib.asynccontextmanager
async def running(jobs: Jobs) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(jobs.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_a_job_runs_at_once_and_again_after_each_interval() -> None:
    # Given a job every 50 ms
    body, jobs = Counted(), Jobs("replica-1")
    jobs.register("sweep", INTERVAL_S, body, "sweeps")
    # When the loops run for a while
    async with running(jobs):
        await until(lambda: jobs.status("sweep").runs >= 3)
        # Then it ran at once and on its interval, and its status tells the last run and the next
        status = jobs.status("sweep")
        assert status.errors == 0 and status.last_error == ""
        assert status.last_result.startswith("run ")
        assert status.last_started_at is not None and status.last_finished_at is not None
        assert status.last_started_at <= status.last_finished_at <= datetime.now(UTC)
        assert status.last_duration_s is not None and status.last_duration_s >= 0
        assert status.interval_s == INTERVAL_S and status.description == "sweeps"
    assert body.most_at_once == 1


async def test_a_failing_job_counts_its_errors_and_keeps_its_schedule(caplog: pytest.LogCaptureFixture) -> None:
    # Given a job that fails on every run
    body, jobs = Counted(), Jobs()
    body.fail = True
    jobs.register("broken", INTERVAL_S, body, "fails")
    # When the loops run
    with caplog.at_level(logging.ERROR, logger="sieve.jobs"):
        async with running(jobs) as loops:
            await until(lambda: jobs.status("broken").errors >= 3)
            # Then every failure is counted and the job still runs on its interval (the loop did not end)
            status = jobs.status("broken")
            assert not loops.done()
            assert status.runs == status.errors >= 3
            assert status.consecutive_errors == status.errors
            assert status.last_error.startswith("RuntimeError: broken on run ")
            # And once it works again, the next scheduled run succeeds and clears the error
            body.fail = False
            await until(lambda: jobs.status("broken").last_error == "")
            healed = jobs.status("broken")
            assert healed.consecutive_errors == 0 and healed.errors >= 3 and healed.last_result.startswith("run ")
    # And each failure was logged with the job's name
    assert any("job broken failed" in r.getMessage() for r in caplog.records)


async def test_run_now_runs_a_job_at_once_and_its_status_shows_the_run() -> None:
    # Given a job whose next scheduled run is a minute away
    body, jobs = Counted(), Jobs()
    jobs.register("watermark", LONG_S, body, "publishes", first_run_s=LONG_S)
    async with running(jobs):
        await until(lambda: jobs.status("watermark").next_run_at is not None)
        assert jobs.status("watermark").runs == 0
        # When an operator runs it now
        outcome = await jobs.run_now("watermark")
        # Then it ran once, and its status says so
        assert outcome.succeeded and outcome.result == "run 1"
        status = jobs.status("watermark")
        assert status.runs == 1 and status.last_result == "run 1" and not status.running
        # And a failing run on demand is an outcome too, counted like a scheduled one
        body.fail = True
        failed = await jobs.run_now("watermark")
        assert not failed.succeeded and failed.error == "RuntimeError: broken on run 2"
        assert jobs.status("watermark").errors == 1
        # And the schedule is kept: the next scheduled run is still the one of before
        assert jobs.status("watermark").next_run_at is not None


async def test_run_now_works_without_the_loops_too() -> None:
    body, jobs = Counted(), Jobs()
    jobs.register("check", LONG_S, body, "checks")
    assert (await jobs.run_now("check")).succeeded
    assert jobs.status("check").runs == 1 and jobs.status("check").next_run_at is None


async def test_run_now_during_a_run_waits_for_that_run_instead_of_starting_another() -> None:
    # Given a job held inside its first run
    body, jobs = Counted(), Jobs()
    body.hold = asyncio.Event()
    jobs.register("slow", INTERVAL_S, body, "slow")
    async with running(jobs):
        await body.entered.wait()
        assert jobs.status("slow").running
        # When two operators ask for a run meanwhile
        waiting = [asyncio.create_task(jobs.run_now("slow")) for _ in range(2)]
        await asyncio.sleep(INTERVAL_S * 2)
        # Then nothing else started: both wait for the run in progress, and get its outcome
        assert body.started == 1 and not any(w.done() for w in waiting)
        body.hold.set()
        outcomes = await asyncio.gather(*waiting)
        assert [o.result for o in outcomes] == ["run 1", "run 1"]
    assert body.most_at_once == 1


async def test_a_caller_that_stops_waiting_does_not_stop_the_run() -> None:
    body, jobs = Counted(), Jobs()
    body.hold = asyncio.Event()
    jobs.register("long", LONG_S, body, "long")
    caller = asyncio.create_task(jobs.run_now("long"))
    await body.entered.wait()
    caller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await caller
    assert jobs.status("long").running
    body.hold.set()
    await until(lambda: jobs.status("long").runs == 1)
    assert jobs.status("long").last_result == "run 1"


async def test_a_trigger_during_a_run_brings_one_more_run_right_after_it() -> None:
    # Given a job with a long interval, held inside its first run
    body, jobs = Counted(), Jobs()
    body.hold = asyncio.Event()
    jobs.register("lexicon-check", LONG_S, body, "checks")
    async with running(jobs):
        await body.entered.wait()
        # When a change is signalled twice while it runs (the run may have read the old state)
        jobs.trigger("lexicon-check")
        jobs.trigger("lexicon-check")
        body.hold.set()
        # Then one more run follows at once, not a minute later, and only one
        await until(lambda: jobs.status("lexicon-check").runs == 2)
        await asyncio.sleep(INTERVAL_S * 2)
        assert jobs.status("lexicon-check").runs == 2
        # And a trigger while it waits ends the wait
        jobs.trigger("lexicon-check")
        await until(lambda: jobs.status("lexicon-check").runs == 3)


async def test_a_run_past_its_time_limit_is_cancelled_and_counted_as_an_error() -> None:
    body, jobs = Counted(), Jobs()
    body.hold = asyncio.Event()  # never set: the run would hang
    jobs.register("probe", LONG_S, body, "probes", timeout_s=0.05)
    outcome = await jobs.run_now("probe")
    assert not outcome.succeeded and outcome.error == "timed out after 0.05 s"
    assert body.running == 0 and jobs.status("probe").errors == 1


async def test_the_loops_end_with_their_task_and_cancel_the_run_in_progress() -> None:
    # Given a job held inside a run
    body, jobs = Counted(), Jobs()
    body.hold = asyncio.Event()
    jobs.register("retention", LONG_S, body, "deletes")
    async with running(jobs) as loops:
        await body.entered.wait()
    # When the loops were cancelled (the server's shutdown), the run ended with them, neither run nor error
    assert loops.done() and body.running == 0
    status = jobs.status("retention")
    assert not status.running and status.runs == 0 and status.errors == 0 and status.next_run_at is None


async def test_a_second_start_of_the_loops_does_nothing() -> None:
    body, jobs = Counted(), Jobs()
    jobs.register("sweep", LONG_S, body, "sweeps")
    async with running(jobs):
        await until(lambda: body.started == 1)
        await asyncio.wait_for(jobs.run(), 1)  # returns at once
        await asyncio.sleep(INTERVAL_S)
        assert body.started == 1


async def test_the_first_run_may_wait_and_next_run_at_says_when() -> None:
    body, jobs = Counted(), Jobs()
    jobs.register("ocr-health", LONG_S, body, "probes", first_run_s=LONG_S)
    async with running(jobs):
        await until(lambda: jobs.status("ocr-health").next_run_at is not None)
        next_run = jobs.status("ocr-health").next_run_at
        assert next_run is not None and 55 < (next_run - datetime.now(UTC)).total_seconds() <= LONG_S
        assert body.started == 0


async def test_jittered_waits_stay_within_their_fraction_of_the_interval() -> None:
    starts: list[float] = []

    async def body() -> None:
        starts.append(asyncio.get_running_loop().time())

    jobs = Jobs(rng=random.Random(7))
    jobs.register("jittered", 0.1, body, "varies", jitter=0.5)
    async with running(jobs):
        await until(lambda: len(starts) >= 6, timeout_s=10)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 0.05 * 0.9 for gap in gaps), gaps
    assert len({round(gap, 2) for gap in gaps}) > 1  # they vary


def test_register_refuses_a_taken_name_and_a_bad_schedule() -> None:
    jobs = Jobs()
    noop: Callable[[], Awaitable[None]] = asyncio.sleep  # type: ignore[assignment]
    jobs.register("a", 1.0, noop, "a")
    for name, interval_s, extra in (
        ("a", 1.0, {}),
        ("", 1.0, {}),
        ("b", 0.0, {}),
        ("b", float("inf"), {}),
        ("b", 1.0, {"jitter": 1.0}),
        ("b", 1.0, {"first_run_s": -1.0}),
        ("b", 1.0, {"timeout_s": 0.0}),
    ):
        with pytest.raises(ValueError):
            jobs.register(name, interval_s, noop, "b", **extra)  # type: ignore[arg-type]
    assert jobs.names == ["a"] and len(jobs) == 1 and "a" in jobs


async def test_an_unknown_job_is_unknown_job() -> None:
    jobs = Jobs()
    with pytest.raises(UnknownJob):
        await jobs.run_now("nope")
    with pytest.raises(UnknownJob):
        jobs.trigger("nope")
    with pytest.raises(UnknownJob):
        jobs.status("nope")
