"""The watermark record, for autoscalers: total pending, active devices, live workers, time.

Published to Redis every watermark_interval_s with a watermark_ttl_s expiry (a record that stopped being
refreshed disappears, so a reader never scales on stale numbers); the GetWatermark RPC reads the same numbers
fresh, plus overloaded and backed-off devices, dead letters, leased tasks and the longest wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from sieve.redis.queue_store import QueueStore
from sieve.redis.scheduler_state import SchedulerState
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2

LISTED_DEVICES = 1000


class Watermark:
    """Reads the fleet's load for GetWatermark and publishes the watermark record (see the module)."""

    def __init__(
        self, state: SchedulerState, queues: QueueStore, settings: Settings, live_workers: Callable[[], Awaitable[int]]
    ) -> None:
        self.state = state
        self.queues = queues
        self.settings = settings
        self.live_workers = live_workers

    async def read(self) -> scheduler_pb2.GetWatermarkResponse:
        gauges = await self.state.gauges(listed=LISTED_DEVICES)
        rank = await self.queues.rank()
        out = scheduler_pb2.GetWatermarkResponse(
            total_pending=gauges.pending,
            active_devices=gauges.devices,
            live_workers=await self.live_workers(),
            overloaded_devices=sorted(gauges.overloaded_devices),
            backoff_devices=gauges.backoff_devices,
            dead_letters=gauges.dead_letters,
            leased=gauges.leased,
        )
        out.at.FromDatetime(datetime.now(UTC))
        out.oldest_wait.FromMilliseconds(int(rank.longest_wait_ms or 0))
        return out

    async def publish_record(self) -> dict[str, object]:
        """Writes the record (total_pending, mac_count, active_workers, timestamp) with its TTL; returns it."""
        mark = await self.read()
        record: dict[str, object] = {
            "total_pending": mark.total_pending,
            "mac_count": mark.active_devices,
            "active_workers": mark.live_workers,
            "timestamp": mark.at.ToDatetime(UTC).isoformat(),
        }
        await self.state.publish_watermark(record, int(self.settings.watermark_ttl_s * 1000))
        return record
