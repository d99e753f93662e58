"""The services as processes of their own (sieve.launch, with readiness, authentication and health as a user
runs them) on a real Redis Cluster: started with SIEVE_REDIS_CLUSTER=true and SIEVE_REDIS_URL naming one node,
they serve, and a submitted text comes back SUCCEEDED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.keys import Keys
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import Cluster, on_free_ports, service_env
from tests.support.platform import wait_final
from tests.support.tasks import text_spec

pytestmark = pytest.mark.e2e


@pytest.fixture
def services(cluster_settings: Settings, pg: asyncpg.Pool, tmp_path: Path) -> Iterator[Cluster]:
    """The services on the Redis Cluster (not started yet), killed before `pg` drops the test's schema."""
    settings = on_free_ports(cluster_settings)
    env = service_env(settings, SIEVE_REDIS_CLUSTER="true", SIEVE_HOUSEKEEPING_INTERVAL_S="0.5")
    services = Cluster.create(settings, env, tmp_path)
    yield services
    services.kill_all()


async def test_the_services_serve_on_the_cluster_and_a_text_succeeds(
    services: Cluster, cluster_redis: Redis, pg: asyncpg.Pool
) -> None:
    await services.start_all(workers=1)
    async with rpc.channel(services.settings.intake_addr, services.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        reply = await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", "加 微 信 免费领取")))
        task = await wait_final(stub, reply.task.task_id)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED
    assert await pg.fetchval("SELECT count(*) FROM results") == 1
    # what the services did went to the cluster (the test's prefix holds the lease key the scheduler made)
    assert await cluster_redis.exists(Keys(services.settings.redis_prefix).lease_key)
