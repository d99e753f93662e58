"""How fast this scheduler replica takes tasks from the queues, published for the intake's retry delays.

The dispatcher counts what it hands out; `DrainMeter.tick`, called after every dispatch round, keeps a few
(time, count) points of the last `WINDOW_S` and publishes the rate over that window at most every
`PUBLISH_EVERY_S` (one HSET: `QueueStore.publish_drain`). A replica that dispatches nothing publishes nothing,
so its entry goes stale and the intake reads "nothing drains" (`intake_svc.admission`).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable

from sieve.queue_store import QueueStore

#: the rate covers this much of the recent past (s)
WINDOW_S = 1.0
#: published at most this often (s)
PUBLISH_EVERY_S = 0.25
#: points closer together than this are not kept (s)
POINT_EVERY_S = 0.05
#: the first publication needs at least this much history (s)
MIN_SPAN_S = 0.1


class DrainMeter:
    """Owns this replica's dispatch-rate window and its entry in the shared drain record."""

    def __init__(self, queues: QueueStore, dispatched: Callable[[], int], *, replica: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queues = queues
        self.dispatched = dispatched
        self.replica = replica or uuid.uuid4().hex[:12]
        self._clock = clock
        self._points: deque[tuple[float, int]] = deque([(clock(), dispatched())])
        self._published_at = -PUBLISH_EVERY_S
        self.rate_per_s = 0.0

    def _rate(self, now: float, count: int) -> float | None:
        if self._points and now - self._points[-1][0] > WINDOW_S:
            self._points.clear()  # idle for a whole window: what comes now starts a fresh one
        if not self._points or now - self._points[-1][0] >= POINT_EVERY_S:
            self._points.append((now, count))
        while len(self._points) > 2 and now - self._points[1][0] >= WINDOW_S:
            self._points.popleft()
        start, first = self._points[0]
        span = now - start
        if span < MIN_SPAN_S:
            return None
        return max(0, count - first) / span

    async def tick(self) -> None:
        """After a dispatch round: publishes the rate when it is time to."""
        now, count = self._clock(), self.dispatched()
        rate = self._rate(now, count)
        if rate is None or now - self._published_at < PUBLISH_EVERY_S:
            return
        self._published_at = now
        self.rate_per_s = rate
        await self.queues.publish_drain(self.replica, rate)


__all__ = ["DrainMeter"]
