"""The scheduler's periodic jobs over JobsService (ListJobs, RunJob), against a real scheduler server with
authentication on, its Redis and PostgreSQL, called by an operator over real gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from scheduler_svc.server import SERVICE_NAME, SchedulerApp
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.rpc.auth import credential_line, new_token
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import jobs_pb2, jobs_pb2_grpc
from tests.security.auth_stack import eventually

SCHEDULER_JOBS = ["housekeeping", "expired-sweep", "watermark", "reconcile", "stats-fold", "retention"]


@dataclass
class Served:
    """A scheduler server, its app, and JobsService stubs of an operator and of a client."""

    app: SchedulerApp
    operator: jobs_pb2_grpc.JobsServiceStub
    client: jobs_pb2_grpc.JobsServiceStub


async def failing_job() -> None:
    raise ConnectionError("the reports store is away")


@pytest.fixture
async def served(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Served]:
    ops, alice = new_token(), new_token()
    settings = settings.replace(
        allow_anonymous=False,
        auth_tokens=",".join([credential_line("ops", "operator", ops), credential_line("alice", "client", alice)]),
        ttl_sweep_interval_s=3600.0,  # scheduled runs of the expired sweep: at start, then not within the test
        retention_check_interval_s=3600.0,
    )
    app = await build_scheduler(settings, Stores.of(redis=redis, pool=pg))
    # a job of this replica that fails on every run, beside the real ones
    app.jobs.register("flaky-probe", 0.2, failing_job, "fails on every run (test)")
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    address = f"127.0.0.1:{server.port}"
    channels = [rpc.channel(address, settings.replace(auth_token=token)) for token in (ops, alice)]
    try:
        yield Served(app, *(jobs_pb2_grpc.JobsServiceStub(c) for c in channels))
    finally:
        for channel in channels:
            await channel.close()
        await server.stop(1)


def by_name(reply: jobs_pb2.ListJobsResponse) -> dict[str, jobs_pb2.Job]:
    return {job.name: job for job in reply.jobs}


async def test_list_jobs_shows_every_periodic_job_of_the_scheduler_with_its_interval(
    served: Served, settings: Settings
) -> None:
    # When an operator lists the scheduler's jobs once they have run
    async def ran() -> bool:
        jobs = by_name(await served.operator.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5))
        return all(jobs[name].runs >= 1 for name in SCHEDULER_JOBS)

    await eventually(ran, what="every job ran once at start")
    reply = await served.operator.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5)
    # Then it sees each of them, in order, with its interval, its replica and its last run
    assert [job.name for job in reply.jobs] == [*SCHEDULER_JOBS, "flaky-probe"]
    jobs = by_name(reply)
    assert jobs["housekeeping"].interval.ToMilliseconds() == settings.housekeeping_interval_s * 1000
    assert jobs["expired-sweep"].interval.ToSeconds() == 3600
    assert jobs["watermark"].interval.ToMilliseconds() == settings.watermark_interval_s * 1000
    assert jobs["reconcile"].interval.ToMilliseconds() == served.app.housekeeping.reconciler.poll_s * 1000
    for job in reply.jobs:
        assert job.description and job.service == "sieve-scheduler"
        assert job.replica == served.app.housekeeping.replica
    sweep = jobs["expired-sweep"]
    assert sweep.last_error == "" and sweep.last_result == "0 queued tasks expired"
    assert sweep.HasField("last_started_at") and sweep.HasField("last_finished_at")
    assert sweep.HasField("next_run_at") and not sweep.running
    assert jobs["retention"].last_error == "" and jobs["retention"].last_result.startswith("made ")
    assert jobs["reconcile"].last_result.startswith(("pass: ", "not this replica's turn"))
    # the next scheduled sweep is an hour away
    wait_s = (sweep.next_run_at.ToDatetime(UTC) - datetime.now(UTC)).total_seconds()
    assert 3500 < wait_s <= 3600


async def test_a_job_run_on_demand_updates_its_status(served: Served, redis: Redis) -> None:
    # Given the expired sweep after its run at start (its next one an hour away)
    async def swept_once() -> bool:
        return served.app.jobs.status("expired-sweep").runs == 1

    await eventually(swept_once)
    before = served.app.jobs.status("expired-sweep")
    # When an operator runs it now
    reply = await served.operator.RunJob(jobs_pb2.RunJobRequest(name="expired-sweep"), timeout=10)
    # Then it ran once more, and the answer and ListJobs both show that run
    assert reply.succeeded
    assert reply.job.name == "expired-sweep" and reply.job.runs == 2 and reply.job.errors == 0
    assert before.last_started_at is not None
    assert reply.job.last_started_at.ToDatetime(UTC) > before.last_started_at
    assert reply.job.last_result == "0 queued tasks expired" and reply.job.HasField("last_duration")
    listed = by_name(await served.operator.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5))["expired-sweep"]
    assert listed.runs == 2 and listed.last_finished_at == reply.job.last_finished_at
    # And the watermark job run on demand writes the record autoscalers read
    await redis.delete(served.app.queues.keys.watermark)
    assert (await served.operator.RunJob(jobs_pb2.RunJobRequest(name="watermark"), timeout=10)).succeeded
    assert await redis.exists(served.app.queues.keys.watermark)

    # And both calls were operator actions, written to the audit log
    async def audited() -> bool:
        return (await _audit_methods(served)).count("/sieve.v1.JobsService/RunJob") == 2

    await eventually(audited, what="RunJob calls in the audit log")


async def _audit_methods(served: Served) -> list[str]:
    pool = served.app.housekeeping.tasks.pool
    return [r["method"] for r in await pool.fetch("SELECT method FROM audit_events WHERE kind = 'operator'")]


async def test_a_failing_job_counts_errors_and_keeps_its_schedule(served: Served) -> None:
    # Given a job that fails on every run, every 0.2 s
    async def failed_twice() -> bool:
        return served.app.jobs.status("flaky-probe").errors >= 2

    await eventually(failed_twice, what="two scheduled runs failed")
    # When an operator runs it now
    reply = await served.operator.RunJob(jobs_pb2.RunJobRequest(name="flaky-probe"), timeout=10)
    # Then the call succeeds and says the run did not, with its error counted
    assert not reply.succeeded
    assert reply.job.last_error == "ConnectionError: the reports store is away"
    assert reply.job.errors == reply.job.runs >= 3 and reply.job.consecutive_errors == reply.job.errors

    # And the job keeps its schedule: it goes on failing every 0.2 s, its next run listed
    async def failed_again() -> bool:
        return served.app.jobs.status("flaky-probe").errors >= reply.job.errors + 2

    await eventually(failed_again, what="scheduled runs go on after the failures")
    listed = by_name(await served.operator.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5))["flaky-probe"]
    assert listed.interval.ToMilliseconds() == 200
    assert listed.running or listed.HasField("next_run_at")
    # And the other jobs are untouched by it
    assert served.app.jobs.status("housekeeping").errors == 0


async def test_run_job_names_the_missing_field_refuses_unknown_jobs_and_clients(served: Served) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        await served.operator.RunJob(jobs_pb2.RunJobRequest(), timeout=5)
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(empty.value) == ["name"]
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await served.operator.RunJob(jobs_pb2.RunJobRequest(name="vacuum"), timeout=5)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert "vacuum" in (unknown.value.details() or "") and "housekeeping" in (unknown.value.details() or "")
    for call in (
        served.client.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5),
        served.client.RunJob(jobs_pb2.RunJobRequest(name="housekeeping"), timeout=5),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await call
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_the_jobs_stop_with_the_server(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    app = await build_scheduler(settings, Stores.of(redis=redis, pool=pg))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)

    async def ticked() -> bool:
        return app.jobs.status("housekeeping").runs >= 1

    await eventually(ticked)
    await server.stop(1)
    runs = app.jobs.status("housekeeping").runs
    await asyncio.sleep(settings.housekeeping_interval_s * 3)
    assert app.jobs.status("housekeeping").runs == runs
    assert all(not s.running and s.next_run_at is None for s in app.jobs.statuses())


async def test_a_scheduler_served_as_its_process_serves_it_answers_for_its_jobs_once_built(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given a scheduler served as `python -m scheduler_svc` serves it: listening first, built once its stores answer
    async def build_step(stores: Stores) -> Built:
        app = await build_scheduler(settings, stores)
        return Built(app.service, before_serving=app.before_serving)

    readiness = Readiness(settings, "sieve-scheduler", [SERVICE_NAME], build_step, redis=True, postgres=True)
    running = await rpc.create_server(readiness.front(), "127.0.0.1:0", settings, serving=False)
    readiness.attach(running)
    channel = rpc.channel(f"127.0.0.1:{running.port}", settings)
    try:
        await readiness.wait_serving(True, timeout_s=30)
        stub = jobs_pb2_grpc.JobsServiceStub(channel)

        # Then its JobsService lists the built replica's jobs, which run
        async def ticked() -> bool:
            jobs = by_name(await stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=5))
            return list(jobs) == SCHEDULER_JOBS and jobs["housekeeping"].runs >= 2

        await eventually(ticked, what="the built scheduler's jobs listed and running")
        assert (await stub.RunJob(jobs_pb2.RunJobRequest(name="watermark"), timeout=10)).succeeded
    finally:
        await channel.close()
        await running.stop(1)
        await readiness.close()
