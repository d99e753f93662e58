"""A real worker (in this process, with the real scheduler and intake) and a real outside process that burns
CPU (started detached: not one of the worker's own processes): the worker holds back while that process runs —
no credits, nothing started, its metrics say so — and takes work again within a second or two once it stops.
Its own work, a child process of its own included, does not hold it back.

The outside load is one burning process per core of this machine, so that it is decisive at the default 75 %
watermark whatever else runs here (and the worker resumes under 65 %, the default 10-point hysteresis, which
other load on a shared machine is less likely to keep it above than a lowered watermark's).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.cpu_burner import start_detached_burner, stop_burner
from tests.integration.conftest import platform_with, text_spec, wait_final
from worker_svc.metrics import WorkerCollector
from worker_svc.pressure import Pressure

#: burns one core for at most 30 s, whatever happens to the test
BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"


async def until(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds it took `check` to hold; AssertionError after timeout_s."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout_s, "condition not reached in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


def metric(worker: object, name: str, resource: str | None = None) -> float:
    for family in WorkerCollector(worker).now():  # type: ignore[arg-type]
        for sample in family.samples:
            if sample.name == name and (resource is None or sample.labels.get("resource") == resource):
                return float(sample.value)
    raise AssertionError(f"no {name}")


async def test_an_outside_process_burning_cpu_holds_the_worker_back_until_it_stops(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg) as p:
        worker = await p.add_worker(worker_id="w-pressure")
        pressure: Pressure = worker.puller.pressure
        # Given a worker that takes work (the rest of this machine is quiet enough)
        try:
            await until(lambda: not pressure.held, 30)
        except AssertionError:
            pytest.skip(f"this machine stays busy without the test: {pressure.reasons()}")
        first = await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("0D:00:00:00:00:01", "before")))
        assert (await wait_final(p.intake, first.task.task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED

        # When other processes (not this worker's) burn every core
        burners = [await asyncio.to_thread(start_detached_burner, 30) for _ in range(os.cpu_count() or 2)]
        try:
            await until(lambda: pressure.held, 10)
            # Then the worker holds back for CPU, says so in its metrics, and starts nothing new
            assert pressure.held_resources() == ["cpu"]
            assert metric(worker, "sieve_worker_held_back", "cpu") == 1
            assert metric(worker, "sieve_worker_over_watermark") == 1
            assert worker.puller.credits_granted == 0
            replies = [
                await p.intake.Submit(
                    intake_pb2.SubmitRequest(task=text_spec(f"0D:00:00:00:01:{i:02x}", f"during {i}"))
                )
                for i in range(5)
            ]
            ids = [r.task.task_id for r in replies]
            await asyncio.sleep(1.0)
            statuses = await pg.fetch("SELECT status FROM tasks WHERE id = ANY($1::uuid[])", ids)
            assert {r["status"] for r in statuses} == {"PENDING"}
        finally:
            for burner in burners:
                stop_burner(burner)
            stopped = time.monotonic()

        # When it stops, Then the worker takes work again within a second or two, and does what waited
        await until(lambda: not pressure.held, 10)
        resumed_s = time.monotonic() - stopped
        assert resumed_s < 3.0, f"resumed {resumed_s:.1f}s after the outside load stopped"
        for task_id in ids:
            assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
        assert metric(worker, "sieve_worker_held_back", "cpu") == 0
        assert metric(worker, "sieve_worker_held_back_seconds_total", "cpu") >= 1.0
        assert pressure.episodes >= 1


async def test_a_worker_busy_with_its_own_work_keeps_taking_it(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, cpu_watermark_pct=40.0) as p:
        # Given a worker (with the scheduler and intake in its own process) that also runs a child process of
        # its own burning a core: this worker's process tree uses half the machine and more
        worker = await p.add_worker(worker_id="w-busy")
        pressure: Pressure = worker.puller.pressure
        try:
            await until(lambda: not pressure.held, 30)
        except AssertionError:
            pytest.skip(f"this machine stays busy without the test: {pressure.reasons()}")
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", BURN)
        try:
            specs = [
                text_spec(f"0E:00:00:00:{d // 256:02x}:{d % 256:02x}", f"task {i}") for i, d in enumerate(range(2000))
            ]
            began = time.monotonic()
            for i in range(0, len(specs), 500):
                await p.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[i : i + 500]))
            # When it works through them, watching its readings
            own: list[float] = []
            deadline = time.monotonic() + 60
            while (
                await pg.fetchval("SELECT count(*) FROM tasks WHERE status = 'SUCCEEDED'") < len(specs)
                or time.monotonic() - began < 3
            ):
                assert time.monotonic() < deadline, "not done in time"
                if pressure.last is not None:
                    own.append(pressure.last.cpu_own_percent)
                await asyncio.sleep(0.2)
            ran_s = time.monotonic() - began
        finally:
            child.kill()
            await child.wait()
        # Then its own share is counted as its own (over the 40 % watermark by itself: a rule that counted it
        # would have held the worker back all along), and it held back for CPU for little of the time, if at
        # all (only what other processes of this shared machine did can hold it back)
        assert statistics.mean(own) >= 40, own
        assert pressure.held_back_seconds()["cpu"] < 0.3 * ran_s, (pressure.held_back_seconds(), ran_s)
