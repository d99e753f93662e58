"""Connecting to Redis: one async client per process, retried while Redis starts."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from sieve.settings import Settings

log = logging.getLogger("sieve.redis")


async def create_redis(settings: Settings, *, attempts: int = 30, delay_s: float = 0.5) -> Redis:
    """A decoded-string async client; pings until Redis answers or the attempts run out."""
    client = Redis.from_url(settings.redis_url, decode_responses=True, health_check_interval=10,
                            socket_keepalive=True)
    for left in range(attempts - 1, -1, -1):
        try:
            await client.ping()
            return client
        except (RedisConnectionError, OSError) as exc:
            if left == 0:
                await client.aclose()
                raise
            log.warning("Redis not reachable (%s); %d retries left", exc, left)
            await asyncio.sleep(delay_s)
    raise RuntimeError("unreachable")
