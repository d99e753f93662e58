"""A test's Redis keys, named through the key schema (sieve.redis.keys) and never spelled by hand: every key of
a prefix found or deleted (a test's cleanup, or Redis losing its memory on purpose)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from sieve.redis.keys import Keys

#: keys asked for per SCAN call, and deleted per DEL call
SCAN_COUNT = 1000
DELETE_CHUNK = 500


async def keys_matching(redis: Redis, pattern: str, count: int = SCAN_COUNT) -> list[Any]:
    """Every key matching the SCAN pattern `pattern`."""
    return [key async for key in redis.scan_iter(match=pattern, count=count)]


async def prefix_keys(redis: Redis, prefix: str, count: int = SCAN_COUNT) -> list[Any]:
    """Every key of the Redis prefix `prefix`."""
    return await keys_matching(redis, Keys(prefix).all_pattern, count)


async def delete_matching(redis: Redis, pattern: str) -> None:
    """Deletes every key matching `pattern` (in chunks of DELETE_CHUNK)."""
    keys = await keys_matching(redis, pattern)
    for i in range(0, len(keys), DELETE_CHUNK):
        await redis.delete(*keys[i : i + DELETE_CHUNK])


async def delete_prefix(redis: Redis, prefix: str) -> None:
    """Deletes every key of the Redis prefix `prefix`."""
    await delete_matching(redis, Keys(prefix).all_pattern)
