"""Fixtures of the fault-injection suite, and the table of counts printed at the end of the run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from sieve.settings import Settings
from tests.faults.harness import AUDITS, Audit
from tests.support.cluster import Cluster, on_free_ports, service_env
from tests.support.servers import RedisProcess


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of the test's own, with no persistence: a restart really loses everything."""
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
async def own_redis(redis_server: RedisProcess) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def fault_cluster(settings: Settings, redis_server: RedisProcess, pg: object, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on the test's own Redis server and PostgreSQL schema (services not started yet)."""
    settings = on_free_ports(settings.replace(redis_url=redis_server.url))
    env = service_env(settings)
    cluster = Cluster.create(settings, env, tmp_path)
    yield cluster
    cluster.kill_all()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if AUDITS:
        terminalreporter.section("fault injection: counts per case")
        terminalreporter.write_line(Audit.HEADER)
        for audit in AUDITS:
            terminalreporter.write_line(audit.row())
