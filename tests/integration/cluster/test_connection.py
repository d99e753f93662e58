"""Connecting to a Redis Cluster (sieve/redis/connection.py): SIEVE_REDIS_CLUSTER=true gives a cluster client seeded
by the node SIEVE_REDIS_URL names, the health check PINGs every node (and answers again once a restarted node is
back), and the eviction-policy check reads every master, naming the one that would evict Sieve's keys."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from sieve.errors import SettingsError
from sieve.redis.connection import EvictionCheck, EvictionPolicyError, create_redis, ping, probe_client
from sieve.settings import Settings
from tests.support.redis_cluster import LocalRedisCluster


async def test_create_redis_answers_with_a_cluster_client_that_knows_every_master(cluster_settings: Settings) -> None:
    client = await create_redis(cluster_settings, attempts=1)
    try:
        assert isinstance(client, RedisCluster)
        assert len(client.get_primaries()) == 3
    finally:
        await client.aclose()


async def test_the_eviction_check_reads_every_master(
    cluster_settings: Settings, redis_cluster: LocalRedisCluster
) -> None:
    client = probe_client(cluster_settings, 2.0)
    check = EvictionCheck(cluster_settings)
    # a third master that is not the seed: a check of the seed alone would not see it
    other = redis_cluster.nodes[2]
    try:
        assert await ping(client)
        await check.check(client)
        assert check.policy == "noeviction"
        with other.client() as node:
            node.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(EvictionPolicyError, match=f"{other.address} runs with maxmemory-policy allkeys-lru"):
            await check.check(client)
        assert check.policy == "allkeys-lru"
    finally:
        with other.client() as node:
            node.config_set("maxmemory-policy", "noeviction")
        await client.aclose()


async def test_the_health_ping_fails_while_any_master_is_gone_and_answers_once_it_is_back(
    cluster_settings: Settings, redis_cluster: LocalRedisCluster
) -> None:
    client = probe_client(cluster_settings, 1.0)
    other = redis_cluster.nodes[2]  # not the seed
    try:
        assert await ping(client)
        redis_cluster.kill(other.port)
        for _ in range(3):  # (each failed try costs redis-py a connection of that node: no cap, no harm)
            with pytest.raises(RedisConnectionError):
                await ping(client)
        other.start()
        redis_cluster.wait_ok()
        assert await ping(client)
    finally:
        if other.proc is None:
            other.start()
        redis_cluster.wait_ok()
        await client.aclose()


@pytest.mark.parametrize("url", ["unix:///run/redis.sock", "redis://127.0.0.1:7000/2"])
def test_a_cluster_url_must_name_a_tcp_node_and_database_0(url: str) -> None:
    with pytest.raises(SettingsError, match="SIEVE_REDIS_CLUSTER"):
        Settings.from_env({"SIEVE_REDIS_CLUSTER": "true", "SIEVE_REDIS_URL": url})
    # the same URLs are fine for a single Redis
    assert not Settings.from_env({"SIEVE_REDIS_URL": url}).redis_cluster
