"""Starts every Sieve service as its own process for a benchmark, on a fresh Redis prefix and schema
(tests/support/cluster.py), and removes both afterwards."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from redis.asyncio import Redis

from sieve.settings import Settings
from tests.support.cluster import Cluster, on_free_ports, service_env
from tests.support.redis import delete_prefix
from tests.support.stores import DATABASE_URL, REDIS_URL, drop_schema


@asynccontextmanager
async def running_cluster(
    workers: int = 2,
    log_dir: Path | None = None,
    worker_env: dict[str, str] | None = None,
    security: str = "auth",
    credentials: dict[str, str] | None = None,
    **overrides: str,
) -> AsyncIterator[Cluster]:
    """Every service as a process; `security` is "auth" (credentials, as a user runs it), "tls" (credentials and
    TLS) or "anonymous" (neither, for side-by-side cost measurements). `credentials` (name -> role) are made
    before the services start (a benchmark's own callers and in-process workers: `cluster.as_caller(name)`)."""
    unique = uuid.uuid4().hex[:8]
    settings = on_free_ports(
        Settings.from_env(
            {},
            redis_url=REDIS_URL,
            redis_prefix=f"bench-{unique}",
            # SIEVE_REDIS_SHARDS=4 python -m tests.benchmarks ...: the benchmarks with the keyspace in shards
            redis_shards=int(os.environ.get("SIEVE_REDIS_SHARDS", "1")),
            database_url=DATABASE_URL,
            database_schema=f"bench_{unique}",
        )
    )
    env = service_env(settings, SIEVE_LOG_LEVEL="WARNING")
    env.update(overrides)
    log_dir = log_dir or Path(f"/tmp/sieve-bench-{unique}")
    os.makedirs(log_dir, exist_ok=True)
    cluster = Cluster.create(settings, env, log_dir, security=security)
    settings = cluster.settings
    for name, role in (credentials or {}).items():
        if not cluster.anonymous:
            cluster.credential(name, role)
    try:
        await cluster.start_all(workers, **(worker_env or {}))
        await asyncio.sleep(0.5)  # let the workers open their Pull streams
        yield cluster
    finally:
        cluster.terminate_all()
        await cleanup(settings)


async def cleanup(settings: Settings) -> None:
    """Every key of the benchmark's Redis prefix, and its PostgreSQL schema, removed."""
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    await delete_prefix(redis, settings.redis_prefix)
    await redis.aclose()
    await drop_schema(settings.database_url, settings.database_schema)
