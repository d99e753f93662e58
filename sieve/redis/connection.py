"""Connecting to Redis: one async client per process, and the checks a service makes before trusting it.

`redis_client` builds the client without connecting (redis-py connects on first use and reconnects by itself
after a restart); `create_redis` also pings it, retrying while Redis starts (tools, tests). The services wait
for Redis through `sieve.rpc.readiness`, which calls `check_eviction_policy` on every (re)connect: Redis holds the
queues, leases and admission counters, and a policy other than `noeviction` lets Redis drop them silently
under memory pressure, so such a Redis is refused (SIEVE_REDIS_REQUIRE_NOEVICTION, default true) or warned
about loudly.

**Redis Cluster** (SIEVE_REDIS_CLUSTER=true; SIEVE_REDIS_URL names any one node): `redis_client` makes a
`redis.asyncio.cluster.RedisCluster` instead, which learns the other nodes from that one and sends each command
to the master of its keys' slot. Every Sieve key carries the hash tag `{prefix}` (sieve/redis/keys.py), so every
script's keys, including the ones a script builds itself, and every MULTI/EXEC live in one slot. The cluster
client is handed around typed as `Redis` (it has the same command methods); what differs is kept here:

- its pipelines refuse `evalsha` (redis-py blocks it in cluster pipelines, although it routes EVALSHA by its
  keys like any keyed command): `SieveCluster.pipeline` gives pipelines that queue it as a plain EVALSHA, so the
  queue store's pipelined script calls work on both kinds of client;
- it has no pub/sub: `node_client` gives a plain client of the master that serves a key's (or channel's) slot,
  to subscribe there (a PUBLISH, also from a script, reaches every node of a cluster);
- SCAN answers per node (`scan_iter` walks every master), CONFIG GET is asked of every master
  (`EvictionCheck`), and a health check PINGs every node (`ping`, on a `probe_client`).

**Packing**: a single Redis's client packs commands with hiredis (`fast_packing`): redis-py's asyncio packer
copies the buffer built so far at every argument, and a script call with thousands of arguments (an enqueueMany
of 1 000 devices, an ackMany of hundreds of leases) spent about 10 us per device there. The cluster client keeps
redis-py's packer (redis-py picks its nodes' connection class itself).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from sieve.redis.reply import reply
from sieve.settings import Settings

hiredis_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as hiredis_pack_command
except ImportError:  # (a dependency: without it redis-py's own packer is used)
    hiredis_pack_command = None

log = logging.getLogger("sieve.redis")

#: the only maxmemory-policy under which Redis never drops Sieve's keys
REQUIRED_POLICY = "noeviction"


class SieveClusterPipeline(ClusterPipeline):
    """A cluster pipeline that takes EVALSHA like any keyed command (routed by its keys' slot)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> ClusterPipeline:  # type: ignore[override]
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)


class SieveCluster(RedisCluster):
    """The asyncio cluster client, with pipelines that take EVALSHA (`SieveClusterPipeline`)."""

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:  # as RedisCluster.pipeline
            return super().pipeline(transaction, shard_hint)
        return SieveClusterPipeline(self, transaction)  # type: ignore[abstract]  # (a Protocol attribute redis-py's class lacks too)


_FAST_CLASSES: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _pack_command(self: AbstractConnection, *args: Any) -> list[bytes]:
    """What redis-py's pack_command sends, byte for byte (a command name holding spaces split, each argument
    encoded by the connection's encoder), packed by hiredis in one pass."""
    first = args[0]
    if isinstance(first, str):
        head: tuple[Any, ...] = tuple(first.encode().split())
    elif b" " in first:
        head = tuple(first.split())
    else:
        head = (first,)
    encode = self.encoder.encode
    assert hiredis_pack_command is not None  # (fast_packing makes no class with this without it)
    return [hiredis_pack_command(head + tuple(map(encode, args[1:])))]


def fast_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """`connection_class` packing its commands with hiredis (see the module); itself without hiredis."""
    if hiredis_pack_command is None:
        return connection_class
    fast = _FAST_CLASSES.get(connection_class)
    if fast is None:
        fast = type(connection_class.__name__, (connection_class,), {"pack_command": _pack_command})
        _FAST_CLASSES[connection_class] = fast
    return fast


def _packing_fast(client: Redis) -> Redis:
    pool = client.connection_pool
    pool.connection_class = fast_packing(pool.connection_class)
    return client


def redis_client(settings: Settings) -> Redis:
    """A decoded-string async client on settings.redis_url (a cluster client with settings.redis_cluster, typed
    as `Redis`: it has the same commands; see the module); connects on first use."""
    if settings.redis_cluster:
        return cast(Redis, cluster_client(settings))
    return _packing_fast(
        Redis.from_url(settings.redis_url, decode_responses=True, health_check_interval=10, socket_keepalive=True)
    )


def cluster_client(settings: Settings, **options: Any) -> SieveCluster:
    """A decoded-string cluster client seeded with the node settings.redis_url names; `options` are RedisCluster's
    (they win)."""
    kwargs: dict[str, Any] = {"decode_responses": True, "health_check_interval": 10, "socket_keepalive": True}
    return cast(SieveCluster, SieveCluster.from_url(settings.redis_url, **(kwargs | options)))


def probe_client(settings: Settings, timeout_s: float) -> Redis:
    """A client for health checks (`ping`, `EvictionCheck`): no retries inside redis-py, short timeouts; two
    connections at most to a single Redis. A cluster client is not capped: redis-py 7.4 counts a connection that
    failed to connect against its node's cap for good, so a capped probe would fail forever after a node's
    restart."""
    if settings.redis_cluster:
        return cast(
            Redis,
            cluster_client(
                settings, retry=Retry(NoBackoff(), 0), socket_connect_timeout=timeout_s, socket_timeout=timeout_s
            ),
        )
    return _packing_fast(
        Redis.from_url(
            settings.redis_url,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            max_connections=2,
        )
    )


async def ping(client: Redis | RedisCluster) -> bool:
    """PING the server, or every node of a cluster (a cluster client's own `ping` asks one node only, so it
    answers True while another master, and the slots it serves, is gone)."""
    if isinstance(client, RedisCluster):
        return bool(await reply(client.ping(target_nodes=RedisCluster.ALL_NODES)))
    return bool(await reply(client.ping()))


def is_cluster(client: Redis | RedisCluster) -> bool:
    """Whether `client` is a Redis Cluster client."""
    return isinstance(client, RedisCluster)


async def node_client(client: RedisCluster, key: str) -> Redis:
    """A plain client of the master that serves `key`'s slot, with the cluster client's connection options (its
    own pool: `aclose` closes it), for what a cluster client cannot do itself: pub/sub."""
    await client.initialize()  # no-op once the slots are known
    node = client.get_node_from_key(key)
    if node is None:
        raise RedisConnectionError(f"no Redis Cluster master serves the slot of {key}")
    return Redis.from_pool(ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs))


def redis_location(url: str) -> str:
    """Where a Redis URL points, without its credentials (for log lines)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"


async def create_redis(settings: Settings, *, attempts: int = 30, delay_s: float = 0.5) -> Redis:
    """A client (see `redis_client`) that answered PING; retries until Redis answers or the attempts run out."""
    client = redis_client(settings)
    for left in range(attempts - 1, -1, -1):
        try:
            await reply(client.ping())
            return client
        except (RedisConnectionError, OSError) as exc:
            if left == 0:
                await client.aclose()
                raise
            log.warning("Redis not reachable (%s); %d retries left", exc, left)
            await asyncio.sleep(delay_s)
    raise RuntimeError("unreachable")


class EvictionPolicyError(Exception):
    """Redis runs with a maxmemory-policy that may evict Sieve's keys; the message names the fix."""


class EvictionCheck:
    """Checks Redis' maxmemory-policy (CONFIG GET) on each connect. A Redis whose ACL or provider refuses
    CONFIG is warned about once and trusted (and not asked again); a wrong policy raises EvictionPolicyError
    when `require` is set (the service stays NOT_SERVING and checks again on its next attempt), else logs an
    error each check."""

    def __init__(self, settings: Settings) -> None:
        self.require = settings.redis_require_noeviction
        self.where = redis_location(settings.redis_url)
        self._warned_unchecked = False
        #: the policy seen on the last check (None: not known)
        self.policy: str | None = None

    async def check(self, client: Redis | RedisCluster) -> None:
        """Reads the policy (of every master, on a cluster) and judges it (see the class)."""
        if self._warned_unchecked:  # refused once: not asked again (each refusal is an ACL LOG entry)
            return
        try:
            policies = await self._policies(client)
        except ResponseError as exc:  # NOPERM from an ACL, or CONFIG renamed away by a managed Redis
            if not self._warned_unchecked:
                self._warned_unchecked = True
                log.warning(
                    "cannot check Redis maxmemory-policy at %s (%s): make sure it is %s, or Redis may "
                    "evict queued tasks and leases under memory pressure",
                    self.where,
                    exc,
                    REQUIRED_POLICY,
                )
            return
        wrong = [(where, policy) for where, policy in policies if policy and policy != REQUIRED_POLICY]
        known = wrong or [(where, policy) for where, policy in policies if policy]
        self.policy = known[0][1] if known else None
        if not wrong:
            return
        where, policy = wrong[0]
        message = (
            f"Redis at {where} runs with maxmemory-policy {policy}: it may evict queued tasks, leases "
            f"and admission counters under memory pressure. Fix: start Redis with --maxmemory-policy "
            f"{REQUIRED_POLICY} (or run CONFIG SET maxmemory-policy {REQUIRED_POLICY})."
        )
        if self.require:
            raise EvictionPolicyError(
                message + " Refusing to serve until then (SIEVE_REDIS_REQUIRE_NOEVICTION=false serves anyway)."
            )
        log.error("%s Serving anyway: SIEVE_REDIS_REQUIRE_NOEVICTION is false.", message)

    async def _policies(self, client: Redis | RedisCluster) -> list[tuple[str, str]]:
        """(where, maxmemory-policy) of the server, or of every master of a cluster ("" when not told)."""
        if not isinstance(client, RedisCluster):
            return [(self.where, _policy(await client.config_get("maxmemory-policy")))]
        await client.initialize()  # no-op once the nodes are known
        return [
            (node.name, _policy(await client.config_get("maxmemory-policy", target_nodes=node)))
            for node in client.get_primaries()
        ]


def _policy(reply: object) -> str:
    return str(reply.get("maxmemory-policy", "")) if isinstance(reply, dict) else ""
