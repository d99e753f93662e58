"""Shared fixtures: every test gets its own Redis key prefix and its own PostgreSQL schema.

Tests run against the real Redis and PostgreSQL named by SIEVE_TEST_REDIS_URL / SIEVE_TEST_DATABASE_URL
(defaults: the local servers; when there are none, embedded ones started for the run and stopped at its end:
tests/support/embedded_stores.py, decided when this module imports `tests.support.stores`, before collection).
A test that needs one that is not there is skipped locally and fails in CI (CI=true).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.settings import Settings
from tests.support import embedded_stores
from tests.support.redis import delete_prefix
from tests.support.stores import DATABASE_URL, REDIS_URL, drop_schema


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which Redis and PostgreSQL the run used, and where they came from (given, local, embedded)."""
    for line in embedded_stores.report_lines():
        terminalreporter.write_line(f"stores: {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The embedded Redis and PostgreSQL this run started, if any, stop with it."""
    embedded_stores.stop()


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
    await client.set(Keys(settings.redis_prefix).generation, "test")
    yield client
    await delete_prefix(client, settings.redis_prefix)
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
    await drop_schema(settings.database_url, settings.database_schema)
