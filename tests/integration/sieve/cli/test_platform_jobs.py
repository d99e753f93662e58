"""`sieve slots` (the scheduler's ListSlotPools, with an external engine running jobs at a real provider on
loopback) and `sieve jobs` / `sieve jobs run` (JobsService of the scheduler and of a running worker), against real
services, Redis and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
from redis.asyncio import Redis

from sieve import rpc
from sieve.settings import Settings
from tests.integration.conftest import Platform
from tests.integration.sieve.cli.conftest import Sieve, json_of
from tests.integration.worker_svc.external_support import external_platform, job_spec, providers_json
from tests.security.auth_stack import eventually
from tests.support.provider import provider_server


async def test_slots_shows_the_pools_their_holders_with_lease_deadlines_and_the_cost(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve
) -> None:
    # Given a provider pool of 2 slots and an engine running 3 jobs of 2 s there
    async with (
        provider_server(cap=2) as provider,
        external_platform(
            settings, redis, pg, providers_json({"vmod": (provider, {"max_slots": 2, "cost_per_job": 0.5})})
        ) as ext,
    ):
        s = ext.settings
        idle = json_of(await sieve(s, "slots", "-o", "json"))
        assert idle["pools"] == [{"name": "vmod", "max_slots": 2, "in_use": 0, "holders": []}]
        await ext.add_engine("engine-1")
        ids = await ext.submit([job_spec(f"0E:00:00:00:01:0{i}", "vmod", duration_s=2.0, n=i) for i in range(3)])

        # When the slots are listed while the jobs run
        async def both_held() -> bool:
            return len(json_of(await sieve(s, "slots", "-o", "json"))["pools"][0]["holders"]) == 2

        await eventually(both_held, 15, "the engine never held both slots")
        held = json_of(await sieve(s, "slots", "-o", "json"))["pools"][0]
        # Then each holder is a job's stage, leased until a moment ahead
        assert held["in_use"] == 2
        now = datetime.now(UTC)
        for h in held["holders"]:
            assert h["holder"].split(":")[0] in ids
            deadline = datetime.fromisoformat(h["lease_deadline"].replace("Z", "+00:00"))
            assert 0 < (deadline - now).total_seconds() <= 6
        table = await sieve(s, "slots")
        assert table.exit_code == 0 and "1 slot pools" in table.stdout and "holders" in table.stdout
        assert held["holders"][0]["holder"] in table.stdout

        # And once they are done the pool is free and the cost is summed per provider and caller
        await ext.wait_all_final(ids, timeout_s=30)

        async def costed() -> bool:
            data = json_of(await sieve(s, "slots", "-o", "json"))
            return bool(data.get("costs")) and data["pools"][0]["in_use"] == 0

        await eventually(costed, 10, "no cost recorded")
        done = json_of(await sieve(s, "slots", "-o", "json"))
        assert [(c["provider"], int(c["jobs"]), c["cost"]) for c in done["costs"]] == [("vmod", 3, 1.5)]
        table = await sieve(s, "slots")
        assert "vmod" in table.stdout and "1.5" in table.stdout


async def test_jobs_lists_and_runs_the_periodic_jobs_of_the_scheduler_and_of_a_worker(
    platform: Platform, sieve: Sieve
) -> None:
    s = platform.settings
    # The scheduler's jobs, with what they do and how often
    listed = json_of(await sieve(s, "jobs", "-o", "json"))
    names = [j["name"] for j in listed["jobs"]]
    assert {"housekeeping", "expired-sweep"} <= set(names)
    assert all(j["service"] == "sieve-scheduler" and j["description"] for j in listed["jobs"])
    table = await sieve(s, "jobs")
    assert table.exit_code == 0 and f"{len(names)} jobs" in table.stdout and "expired-sweep" in table.stdout

    # Running one now answers its run; the runs count goes up
    before = next(j for j in listed["jobs"] if j["name"] == "expired-sweep")["runs"]
    ran = json_of(await sieve(s, "jobs", "run", "expired-sweep", "-o", "json"))
    assert ran["succeeded"] is True and ran["job"]["name"] == "expired-sweep" and ran["job"]["runs"] > before
    plain = await sieve(s, "jobs", "run", "expired-sweep")
    assert plain.exit_code == 0 and plain.stdout.startswith("expired-sweep: done in")
    # a job that is not there: NOT_FOUND (exit 3) naming the ones there are
    missing = await sieve(s, "jobs", "run", "no-such-job")
    assert missing.exit_code == 3 and "housekeeping" in missing.stderr and "Traceback" not in missing.output

    # The intake has none; a worker's own server (--at) has its lexicon check, which runs on demand
    assert json_of(await sieve(s, "jobs", "--service", "intake", "-o", "json")) == {"jobs": []}
    worker = platform.workers[0]
    served = await rpc.create_server(
        rpc.Service(name="sieve-worker", service_names=[], register=lambda _: None, jobs=worker.jobs),
        "127.0.0.1:0",
        s,
    )
    try:
        at = f"127.0.0.1:{served.port}"
        theirs = json_of(await sieve(s, "jobs", "--at", at, "-o", "json"))
        assert [j["name"] for j in theirs["jobs"]] == ["lexicon-check"]
        checked = json_of(await sieve(s, "jobs", "run", "lexicon-check", "--at", at, "-o", "json"))
        assert checked["succeeded"] and f"version {worker.lexicon.version}" in checked["job"]["last_result"]
    finally:
        await served.stop(1)
    # a server that is not there: exit 5, its address named
    gone = await sieve(s, "jobs", "--at", "127.0.0.1:1")
    assert gone.exit_code == 5 and "127.0.0.1:1" in gone.stderr
