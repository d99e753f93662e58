"""Starts every Sieve service as its own process for a benchmark, on a fresh Redis prefix and schema."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from redis.asyncio import Redis

from sieve.settings import Settings
from tests.e2e.conftest import Cluster, free_port, service_env

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("SIEVE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("SIEVE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@asynccontextmanager
async def running_cluster(workers: int = 2, log_dir: Path | None = None,
                          worker_env: dict[str, str] | None = None, security: str = "auth",
                          credentials: dict[str, str] | None = None, **overrides: str) -> AsyncIterator[Cluster]:
    """Every service as a process; `security` is "auth" (credentials, as a user runs it), "tls" (credentials and
    TLS) or "anonymous" (neither, for side-by-side cost measurements). `credentials` (name -> role) are made
    before the services start (a benchmark's own callers and in-process workers: `cluster.as_caller(name)`)."""
    unique = uuid.uuid4().hex[:8]
    ports = {name: free_port() for name in ("intake", "scheduler", "registry")}
    settings = Settings.from_env({}, redis_url=REDIS_URL, redis_prefix=f"bench-{unique}",
                                 database_url=DATABASE_URL, database_schema=f"bench_{unique}",
                                 intake_addr=f"127.0.0.1:{ports['intake']}",
                                 scheduler_addr=f"127.0.0.1:{ports['scheduler']}",
                                 registry_addr=f"127.0.0.1:{ports['registry']}")
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
        cluster.start("registry", "registry_svc")
        await cluster.wait_healthy(settings.registry_addr, "registry")
        cluster.start("scheduler", "scheduler_svc")
        await cluster.wait_healthy(settings.scheduler_addr, "scheduler")
        cluster.start("intake", "intake_svc")
        await cluster.wait_healthy(settings.intake_addr, "intake")
        for i in range(workers):
            port = free_port()
            cluster.metrics[f"worker-{i + 1}"] = f"127.0.0.1:{free_port()}"
            cluster.start(f"worker-{i + 1}", "worker_svc", SIEVE_WORKER_ID=f"worker-{i + 1}",
                          SIEVE_WORKER_HEALTH_ADDR=f"127.0.0.1:{port}",
                          SIEVE_WORKER_METRICS_ADDR=cluster.metrics[f"worker-{i + 1}"], **(worker_env or {}))
            await cluster.wait_healthy(f"127.0.0.1:{port}", f"worker-{i + 1}")
        await asyncio.sleep(0.5)  # let the workers open their Pull streams
        yield cluster
    finally:
        cluster.terminate_all()
        await cleanup(settings)


async def cleanup(settings: Settings) -> None:
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    keys = [k async for k in redis.scan_iter(match="{" + settings.redis_prefix + "}*", count=1000)]
    for i in range(0, len(keys), 500):
        await redis.delete(*keys[i : i + 500])
    await redis.aclose()
    conn = await asyncpg.connect(settings.database_url)
    await conn.execute(f'DROP SCHEMA IF EXISTS "{settings.database_schema}" CASCADE')
    await conn.close()
