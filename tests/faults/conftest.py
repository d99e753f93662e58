"""Fixtures of the fault-injection suite, and the table of counts printed at the end of the run."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from sieve.settings import Settings
from tests.e2e.conftest import Cluster, free_port, service_env
from tests.faults.harness import AUDITS, Audit, RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
async def own_redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def fault_cluster(settings: Settings, redis_server: RedisServer, pg: object, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on the test's own Redis server and PostgreSQL schema (services not started yet)."""
    ports = {name: free_port() for name in ("intake", "scheduler", "registry")}
    settings = settings.replace(redis_url=redis_server.url, intake_addr=f"127.0.0.1:{ports['intake']}",
                                scheduler_addr=f"127.0.0.1:{ports['scheduler']}",
                                registry_addr=f"127.0.0.1:{ports['registry']}")
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
