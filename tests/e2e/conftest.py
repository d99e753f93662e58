"""Every service as its own process on loopback ports, sharing this test's Redis prefix and schema
(tests/support/cluster.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sieve.launch import free_port
from sieve.settings import Settings
from tests.support.cluster import Cluster, on_free_ports, service_env


@pytest.fixture
def cluster_env(settings: Settings, pg: object, redis: object, tmp_path: Path) -> Iterator[Cluster]:
    """The cluster, services not started yet. It needs `pg` and `redis`, so its processes are killed before
    their teardown drops the schema and the prefix (a service still querying while DROP SCHEMA takes its locks
    can deadlock with it)."""
    settings = on_free_ports(settings)
    # the test's "client" may use every priority (HIGH and CRITICAL are entitlements)
    env = service_env(
        settings,
        SIEVE_SHUTDOWN_GRACE_S="10",
        SIEVE_HOUSEKEEPING_INTERVAL_S="0.5",
        SIEVE_CALLER_POLICIES="client:priorities=HIGH|CRITICAL",
    )
    metrics = {name: f"127.0.0.1:{free_port()}" for name in ("intake", "scheduler", "registry")}
    env.update({f"SIEVE_{name.upper()}_METRICS_ADDR": addr for name, addr in metrics.items()})
    env["SIEVE_WORKER_METRICS_ADDR"] = "127.0.0.1:0"  # `cluster` gives each worker its own port
    cluster = Cluster.create(settings, env, tmp_path, metrics=metrics)
    yield cluster
    cluster.kill_all()


@pytest.fixture
async def cluster(cluster_env: Cluster, pg: object, redis: object) -> AsyncIterator[Cluster]:
    """Registry, scheduler, intake and two workers, all healthy (pg/redis fixtures clean up after)."""
    await cluster_env.start_all(workers=2)
    yield cluster_env
