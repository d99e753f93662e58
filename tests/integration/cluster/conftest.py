"""Fixtures of the Redis Cluster tests: one real three-master cluster of the run's own
(tests/support/redis_cluster.py), and per test the usual isolation on it — the test's own key prefix and PostgreSQL
schema — with settings that name the cluster (SIEVE_REDIS_CLUSTER=true) and split the keyspace into CLUSTER_SHARDS
shards (SIEVE_REDIS_SHARDS: each shard's keys in the slot of its hash tag, the shards spread over the three
masters), and Sieve's own cluster client (sieve.redis.connection.redis_client)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from sieve.redis.connection import redis_client
from sieve.redis.keys import Keys
from sieve.settings import Settings
from tests.support.redis import delete_prefix
from tests.support.redis_cluster import LocalRedisCluster, redis_cluster

__all__ = ["redis_cluster"]  # the run's cluster (session-scoped), offered to the tests here

#: shards of the keyspace in the cluster tests: two per master
CLUSTER_SHARDS = 6


@pytest.fixture
def cluster_settings(settings: Settings, redis_cluster: LocalRedisCluster) -> Settings:
    """The test's settings, on the cluster."""
    on_cluster = settings.replace(redis_url=redis_cluster.url, redis_cluster=True, redis_shards=CLUSTER_SHARDS)
    on_cluster.validate()
    return on_cluster


@pytest.fixture
async def cluster_redis(cluster_settings: Settings, redis_cluster: LocalRedisCluster) -> AsyncIterator[Redis]:
    """Sieve's cluster client on the test's prefix, initialised as the scheduler leaves it (a generation)."""
    redis_cluster.wait_ok()  # a test before this one may have restarted a master
    client = redis_client(cluster_settings)
    for shard in range(CLUSTER_SHARDS):
        keys = Keys(cluster_settings.redis_prefix, shard, CLUSTER_SHARDS)
        await client.set(keys.generation, "test")
        await client.set(keys.shard_count, CLUSTER_SHARDS)
    yield client
    await delete_prefix(client, cluster_settings.redis_prefix)
    await client.aclose()
