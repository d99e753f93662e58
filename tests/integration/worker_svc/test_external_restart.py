"""kill -9 of the external engine in the middle of its work: jobs submitted and running at the provider, jobs
whose output is being downloaded. The engine runs as its own process (`python -m worker_svc`, role external)
against the in-process platform and a real provider on loopback; a second process takes over."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import asyncpg
from redis.asyncio import Redis

from sieve.launch import ServiceProcess
from sieve.settings import Settings
from sieve.v1 import types_pb2
from tests.integration.worker_svc.external_support import ExternalPlatform, external_platform, job_spec, providers_json
from tests.support.cluster import ROOT, service_env
from tests.support.provider import provider_server


def _engine(ext: ExternalPlatform, name: str, logs: Path) -> ServiceProcess:
    s = ext.settings
    env = service_env(
        s,
        SIEVE_WORKER_ROLE="external",
        SIEVE_WORKER_ID=name,
        SIEVE_EXTERNAL_PROVIDERS=s.external_providers,
        SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS=s.outbound_allow_private_nets,
        SIEVE_EXTERNAL_TICK_S=str(s.external_tick_s),
        SIEVE_EXTERNAL_TICK_REST_S=str(s.external_tick_rest_s),
        SIEVE_EXTERNAL_SLOT_LEASE_S=str(s.external_slot_lease_s),
        SIEVE_ALLOW_ANONYMOUS="true",
        SIEVE_TEST_HOOKS="true",
        SIEVE_FIXED_RESOURCES=s.fixed_resources,
        SIEVE_WORKER_METRICS_ADDR="",
        SIEVE_WORKER_HEALTH_ADDR="127.0.0.1:0",
        SIEVE_HEARTBEAT_INTERVAL_S="1",
    )
    process = ServiceProcess(name, "worker_svc", env, logs / f"{name}.log", ROOT)
    process.start()
    return process


async def test_a_killed_engine_is_replaced_and_every_job_completes_once_with_no_slot_leaked(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, tmp_path: Path
) -> None:
    # Given a provider with 5 slots whose result downloads take a while, and an engine process
    async with (
        provider_server(cap=5, result_delay_s=0.4) as provider,
        external_platform(
            settings,
            redis,
            pg,
            providers_json({"vmod": (provider, {"max_slots": 5})}),
            external_slot_lease_s=20.0,  # longer than a restart: the new engine takes the dead one's slots back
        ) as ext,
    ):
        first = _engine(ext, "engine-1", tmp_path)
        second: ServiceProcess | None = None
        try:
            ids = await ext.submit(
                [
                    job_spec(f"0E:00:00:05:{i % 6:02x}:00", "vmod", duration_s=0.3 + (i % 5) * 0.15, n=i)
                    for i in range(50)
                ]
            )
            # When it is killed -9 with jobs running at the provider and outputs being downloaded
            deadline = time.monotonic() + 60
            while not (provider.results_served >= 5 and provider.running() and provider.downloading):
                assert time.monotonic() < deadline, first.tail(30)
                await asyncio.sleep(0.02)
            in_flight, finishing = len(provider.running()), provider.downloading
            assert first.proc is not None
            os.kill(first.proc.pid, signal.SIGKILL)
            first.proc.wait()
            killed_at = len(provider.jobs)
            # And another engine process starts
            second = _engine(ext, "engine-2", tmp_path)
            tasks = await ext.wait_all_final(ids, timeout_s=90)
            # Then every job completed
            assert {t.status for t in tasks.values()} == {types_pb2.TASK_STATUS_SUCCEEDED}, second.tail(40)
            assert in_flight > 0 and finishing > 0 and 0 < killed_at < 50
            # And the provider made exactly one job per (task, stage): resumed, never submitted again
            per_stage = provider.submits_per_stage()
            twice = {k: n for k, n in per_stage.items() if n != 1}
            assert len(per_stage) == 50 and not twice, (
                f"submitted more than once: {twice}; keys: "
                f"{sorted(j.key for j in provider.jobs.values() if j.key.rsplit(':', 1)[0] in twice)}\n"
                f"engine-1:\n{first.tail(60)}\nengine-2:\n{second.tail(60)}"
            )
            assert provider.rejected_429 == 0 and provider.max_running <= 5
            # And some were finished by the second engine after the first had begun them
            resumed = await pg.fetchval(
                "SELECT count(*) FROM external_jobs j JOIN results r ON r.task_id = j.task_id "
                "WHERE r.worker_id = 'engine-2' AND j.submitted_at < (SELECT min(created_at) FROM results "
                "WHERE worker_id = 'engine-2')"
            )
            assert resumed > 0
            # And no slot leaked: the pool is empty, no stage left submitted or finishing
            assert (await ext.pools().state("vmod")).in_use == 0
            assert await pg.fetchval("SELECT count(*) FROM external_jobs WHERE state <> 'completed'") == 0
        finally:
            for process in (first, second):
                if process is not None and process.exited() is None and process.proc is not None:
                    process.proc.kill()
                    process.proc.wait()
                if process is not None:
                    process.close_log()
