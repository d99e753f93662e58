"""Connecting to Redis: one async client per process, and the checks a service makes before trusting it.

`redis_client` builds the client without connecting (redis-py connects on first use and reconnects by itself
after a restart); `create_redis` also pings it, retrying while Redis starts (tools, tests). The services wait
for Redis through `sieve.rpc.readiness`, which calls `check_eviction_policy` on every (re)connect: Redis holds the
queues, leases and admission counters, and a policy other than `noeviction` lets Redis drop them silently
under memory pressure, so such a Redis is refused (SIEVE_REDIS_REQUIRE_NOEVICTION, default true) or warned
about loudly.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from sieve.redis.reply import reply
from sieve.settings import Settings

log = logging.getLogger("sieve.redis")

#: the only maxmemory-policy under which Redis never drops Sieve's keys
REQUIRED_POLICY = "noeviction"


def redis_client(settings: Settings) -> Redis:
    """A decoded-string async client on settings.redis_url; connects on first use."""
    return Redis.from_url(settings.redis_url, decode_responses=True, health_check_interval=10, socket_keepalive=True)


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

    async def check(self, client: Redis) -> None:
        if self._warned_unchecked:  # refused once: not asked again (each refusal is an ACL LOG entry)
            return
        try:
            reply = await client.config_get("maxmemory-policy")
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
        policy = str(reply.get("maxmemory-policy", "")) if isinstance(reply, dict) else ""
        self.policy = policy or None
        if not policy or policy == REQUIRED_POLICY:
            return
        message = (
            f"Redis at {self.where} runs with maxmemory-policy {policy}: it may evict queued tasks, leases "
            f"and admission counters under memory pressure. Fix: start Redis with --maxmemory-policy "
            f"{REQUIRED_POLICY} (or run CONFIG SET maxmemory-policy {REQUIRED_POLICY})."
        )
        if self.require:
            raise EvictionPolicyError(
                message + " Refusing to serve until then (SIEVE_REDIS_REQUIRE_NOEVICTION=false serves anyway)."
            )
        log.error("%s Serving anyway: SIEVE_REDIS_REQUIRE_NOEVICTION is false.", message)
