"""The watermark record (seed 5.6): total pending, active devices, live workers, time.

Published to Redis every watermark_interval_s with a watermark_ttl_s expiry, for autoscalers; the
GetWatermark RPC reads the same numbers fresh, plus overloaded and backed-off devices, dead letters,
leased tasks and the longest wait.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from redis.asyncio import Redis

from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2

LISTED_DEVICES = 1000


class Watermark:
    def __init__(self, redis: Redis, queues: QueueStore, settings: Settings,
                 live_workers: Callable[[], Awaitable[int]]) -> None:
        self.redis = redis
        self.queues = queues
        self.settings = settings
        self.live_workers = live_workers

    async def read(self) -> scheduler_pb2.GetWatermarkResponse:
        k = self.queues.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(k.pending)
            pipe.scard(k.devices)
            pipe.srandmember(k.overloaded, LISTED_DEVICES)
            pipe.zrange(k.backoff, 0, LISTED_DEVICES - 1)
            pipe.llen(k.dead_letters)
            pipe.zcard(k.leases)
            pending, devices, overloaded, backoff, dead, leased = await pipe.execute()
        rank = await self.queues.rank()
        out = scheduler_pb2.GetWatermarkResponse(
            total_pending=int(pending or 0), active_devices=devices, live_workers=await self.live_workers(),
            overloaded_devices=sorted(overloaded or []), backoff_devices=backoff, dead_letters=dead,
            leased=leased)
        out.at.FromDatetime(datetime.now(UTC))
        out.oldest_wait.FromMilliseconds(int(rank.longest_wait_ms or 0))
        return out

    async def publish(self) -> dict[str, object]:
        """Writes the seed's record with its TTL; returns it."""
        mark = await self.read()
        record: dict[str, object] = {
            "total_pending": mark.total_pending,
            "mac_count": mark.active_devices,
            "active_workers": mark.live_workers,
            "timestamp": mark.at.ToDatetime(UTC).isoformat(),
        }
        await self.redis.set(self.queues.keys.watermark, json.dumps(record),
                             px=int(self.settings.watermark_ttl_s * 1000))
        return record
