"""Shared fixtures: every test gets its own Redis key prefix and its own PostgreSQL schema.

Tests run against the real Redis and PostgreSQL named by SIEVE_TEST_REDIS_URL / SIEVE_TEST_DATABASE_URL
(defaults: the local servers). A test that needs one that is not there is skipped locally and fails in
CI (CI=true).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve.settings import Settings

REDIS_URL = os.environ.get("SIEVE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("SIEVE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _missing(what: str, exc: Exception) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is required in CI: {exc}")
    pytest.skip(f"{what} not available: {exc}")


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def settings(unique: str) -> Settings:
    """Settings isolated to this test: own Redis prefix, own database schema, quick timers."""
    return Settings.from_env(
        {},
        redis_url=REDIS_URL,
        redis_prefix=f"test-{unique}",
        database_url=DATABASE_URL,
        database_schema=f"test_{unique}",
        housekeeping_interval_s=0.2,
        shutdown_grace_s=3.0,
        # in-process servers of a test serve callers without a credential (the anonymous principal holds every
        # role); tests of authentication configure credentials themselves, and e2e clusters always run with them
        allow_anonymous=True,
        grpc_reflection=True,
    )


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        await client.ping()
    except Exception as exc:
        await client.aclose()
        _missing("Redis", exc)
    # Redis is initialised for this prefix, as the scheduler does at start (rebuild from PostgreSQL)
    await client.set("{" + settings.redis_prefix + "}:generation", "test")
    yield client
    keys = [k async for k in client.scan_iter(match="{" + settings.redis_prefix + "}*", count=1000)]
    for i in range(0, len(keys), 500):
        await client.delete(*keys[i : i + 500])
    await client.aclose()


@pytest.fixture
async def pg(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    """A pool on this test's own schema (migrated); the schema is dropped afterwards."""
    from sieve.db import create_pool

    try:
        pool = await create_pool(settings, attempts=1)
    except Exception as exc:
        _missing("PostgreSQL", exc)
    yield pool
    await pool.close()
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{settings.database_schema}" CASCADE')
    finally:
        await conn.close()
