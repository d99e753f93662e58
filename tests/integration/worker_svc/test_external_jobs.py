"""External jobs end to end in one process: intake, scheduler, registry, the external engine (a worker role) and
a real provider on loopback that enforces its cap with 429 — against real Redis and PostgreSQL."""

from __future__ import annotations

import json
import random

import asyncpg
from redis.asyncio import Redis

from sieve.settings import Settings
from sieve.v1 import types_pb2
from tests.integration.worker_svc.external_support import external_platform, job_spec, providers_json
from tests.support.provider import provider_server

TICK_S = 0.2


async def test_200_jobs_over_20_devices_never_exceed_the_providers_cap_and_all_complete(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given a provider that runs at most 5 jobs at once (a 6th POST gets 429) and an engine with a pool of 5
    rng = random.Random(16)
    async with (
        provider_server(cap=5) as provider,
        external_platform(settings, redis, pg, providers_json({"vmod": (provider, {"max_slots": 5})})) as ext,
    ):
        await ext.add_engine("engine-1")
        # When 20 devices submit 10 jobs each, of random short durations
        durations = {}
        specs = []
        for d in range(20):
            for i in range(10):
                duration = round(rng.uniform(0.05, 0.6), 3)
                specs.append(job_spec(f"0E:00:00:00:{d:02x}:00", "vmod", duration_s=duration, flag=i % 3 == 0, n=i))
                durations[(d, i)] = duration
        ids = await ext.submit(specs)
        tasks = await ext.wait_all_final(ids, timeout_s=90)

        # Then every job completed, with the provider's output as its result
        assert {t.status for t in tasks.values()} == {types_pb2.TASK_STATUS_SUCCEEDED}, [
            (t.status, t.error) for t in tasks.values() if t.status != types_pb2.TASK_STATUS_SUCCEEDED
        ][:3]
        blocked = [t for t in tasks.values() if t.result.verdict == types_pb2.VERDICT_BLOCK]
        assert len(blocked) == sum(1 for s in specs if json.loads(s.external.input_json)["flag"])
        assert all(t.result.hits[0].word == "violence" for t in blocked)
        # And the provider never saw more than 5 at once: no 429, each (task, stage) submitted once
        assert provider.rejected_429 == 0
        assert provider.max_running <= 5
        assert len(provider.jobs) == 200 and set(provider.submits_per_stage().values()) == {1}
        # And no job was polled more than its duration / interval + 2 times
        for job in provider.jobs.values():
            assert job.polls <= job.duration_s / TICK_S + 2, (job.id, job.polls, job.duration_s)
        # And the record: every stage completed, cost and polls written, the pool empty
        rows = await pg.fetch("SELECT state, polls FROM external_jobs")
        assert len(rows) == 200 and {r["state"] for r in rows} == {"completed"}
        assert sum(r["polls"] for r in rows) == sum(j.polls for j in provider.jobs.values())
        assert (await ext.pools().state("vmod")).in_use == 0
