"""Slot utilisation of external jobs while a backlog exists (design 004): busy slot-seconds / available slot-seconds,
and poll requests per job, with the default 10 s tick and a shorter one.

One run per tick setting: intake, scheduler and registry in this process, one external engine (in this process
too: its work is waiting on the provider), a real provider on loopback with `cap` slots (tests/support/provider.py)
and a pool of the same size; `jobs` jobs of random durations (uniform in `durations_s`) are submitted at once over
`devices` devices, so a backlog exists until the last job reaches the provider. Busy slot-seconds are the provider's
(from each POST to the job's end) inside that window [first job started, last job started]; available slot-seconds
are cap x the window. A slot is idle between a job's end and the poll that sees it (on average half a tick) plus
the hand-out of the next job — the cost the tick interval sets. Polls per job are the provider's GETs per job.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass

import asyncpg
from redis.asyncio import Redis

from sieve.db import create_pool
from sieve.redis.keys import Keys
from sieve.settings import Settings
from tests.benchmarks.report import Row
from tests.integration.worker_svc.external_support import external_platform, job_spec, providers_json
from tests.support.provider import provider_server
from tests.support.redis import delete_prefix
from tests.support.stores import DATABASE_URL, REDIS_URL, drop_schema

#: the share of slot-seconds busy while a backlog exists that the shorter tick must reach
TARGET = 0.9


@dataclass(frozen=True)
class Utilisation:
    tick_s: float
    jobs: int
    cap: int
    completed: int
    busy_slot_s: float
    available_slot_s: float
    polls_per_job: float
    max_polls_over_bound: int
    rejected_429: int
    max_running: int
    wall_s: float

    @property
    def ratio(self) -> float:
        return self.busy_slot_s / self.available_slot_s if self.available_slot_s else 0.0


async def measure(
    tick_s: float, jobs: int, devices: int, cap: int, durations_s: tuple[float, float], seed: int = 4
) -> Utilisation:
    unique = uuid.uuid4().hex[:10]
    settings = Settings.from_env(
        {},
        redis_url=REDIS_URL,
        redis_prefix=f"bench-ext-{unique}",
        database_url=DATABASE_URL,
        database_schema=f"bench_ext_{unique}",
        housekeeping_interval_s=0.2,
        shutdown_grace_s=3.0,
        allow_anonymous=True,
        max_per_device_pending=max(200, jobs),
    )
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    await redis.set(Keys(settings.redis_prefix).generation, "bench")
    pg: asyncpg.Pool = await create_pool(settings, attempts=1)
    rng = random.Random(seed)
    try:
        async with (
            provider_server(cap=cap) as provider,
            external_platform(
                settings,
                redis,
                pg,
                providers_json({"vmod": (provider, {"max_slots": cap, "poll_interval_s": tick_s, "timeout_s": 600})}),
                external_tick_s=tick_s,
                external_tick_rest_s=min(2.0, tick_s / 5),
                external_slot_lease_s=max(60.0, tick_s * 6),
            ) as ext,
        ):
            await ext.add_engine("bench-engine")
            began = time.monotonic()
            specs = [
                job_spec(
                    f"0B:00:00:00:{i % devices:02x}:00", "vmod", duration_s=round(rng.uniform(*durations_s), 3), n=i
                )
                for i in range(jobs)
            ]
            ids = await ext.submit(specs)
            longest = durations_s[1] + 2 * tick_s
            tasks = await ext.wait_all_final(ids, timeout_s=(jobs / cap + 2) * longest + 30)
            wall_s = time.monotonic() - began
            starts = sorted(j.started for j in provider.jobs.values())
            since, until = starts[0], starts[-1]
            busy = provider.busy_slot_seconds(since, until)
            completed = sum(1 for t in tasks.values() if t.result.worker_id == "bench-engine")
            polls = [j.polls for j in provider.jobs.values()]
            over = sum(1 for j in provider.jobs.values() if j.polls > j.duration_s / tick_s + 2)
            return Utilisation(
                tick_s,
                jobs,
                cap,
                completed,
                busy,
                cap * (until - since),
                sum(polls) / max(1, len(polls)),
                over,
                provider.rejected_429,
                provider.max_running,
                wall_s,
            )
    finally:
        await pg.close()
        await drop_schema(settings.database_url, settings.database_schema)
        await delete_prefix(redis, settings.redis_prefix)
        await redis.aclose()


def describe(u: Utilisation) -> str:
    return (
        f"external tick {u.tick_s:g} s: {u.completed}/{u.jobs} jobs, cap {u.cap}: utilisation {u.ratio:.3f} "
        f"({u.busy_slot_s:.1f} / {u.available_slot_s:.1f} slot-s), {u.polls_per_job:.2f} polls/job "
        f"({u.max_polls_over_bound} over duration/tick + 2), 429s {u.rejected_429}, max running {u.max_running}, "
        f"{u.wall_s:.1f} s"
    )


async def measure_both(
    default_tick_s: float, short_tick_s: float, jobs: int, devices: int, cap: int, durations_s: tuple[float, float]
) -> tuple[Utilisation, Utilisation]:
    default = await measure(default_tick_s, jobs, devices, cap, durations_s)
    short = await measure(short_tick_s, jobs, devices, cap, durations_s)
    return default, short


def rows(default: Utilisation, short: Utilisation) -> list[Row]:
    out: list[Row] = []
    for u, target, passed in (
        (default, "context (the default tick)", None),
        (short, f">= {TARGET}", short.ratio >= TARGET),
    ):
        ok = u.completed == u.jobs and u.rejected_429 == 0 and u.max_running <= u.cap
        out.append(
            Row(
                "external",
                f"slot utilisation with a backlog, tick {u.tick_s:g} s, {u.jobs} jobs, cap {u.cap}",
                f"{u.busy_slot_s:.1f} / {u.available_slot_s:.1f} slot-s = {u.ratio:.3f}; "
                f"{u.polls_per_job:.2f} polls/job",
                target,
                None if passed is None and ok else (bool(passed) and ok),
                {
                    "tick_s": u.tick_s,
                    "utilisation": round(u.ratio, 4),
                    "busy_slot_s": round(u.busy_slot_s, 2),
                    "available_slot_s": round(u.available_slot_s, 2),
                    "polls_per_job": round(u.polls_per_job, 3),
                    "polls_over_bound": u.max_polls_over_bound,
                    "rejected_429": u.rejected_429,
                    "max_running": u.max_running,
                    "completed": u.completed,
                },
                note="" if ok else "jobs lost, 429s, or over the cap",
            )
        )
    return out


if __name__ == "__main__":
    import sys

    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    u = asyncio.run(
        measure(
            args.get("tick_s", 1.0),
            args.get("jobs", 40),
            args.get("devices", 8),
            args.get("cap", 5),
            tuple(args.get("durations_s", (2.0, 6.0))),  # type: ignore[arg-type]
        )
    )
    print(describe(u))
