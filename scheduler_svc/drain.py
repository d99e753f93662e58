"""How fast this scheduler replica takes tasks from the queues, published for the intake's retry delays.

The dispatcher counts what it hands out; `DrainMeter.tick`, called after every dispatch round, keeps (time,
count) points of the last `LONG_WINDOW_S` and publishes, at most every `PUBLISH_EVERY_S` (one HSET:
`QueueStore.publish_drain`), the larger of two rates: over the last `WINDOW_S` (what it does now) and over the
last `LONG_WINDOW_S` (what it did lately: a moment in which every worker was full or held back does not make a
client wait as if the queues had slowed for good). After a whole window without dispatching, a window starts
afresh, so that a burst is not diluted by the quiet before it. An idle dispatcher (no work) still ticks about
every second and says so (its rate, 0 when it has done nothing lately); one that waits for credits (every
worker full or holding back) does not tick at all, so its entry goes stale and the intake reads a pause in
draining (`intake_svc.admission`).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable

from sieve.redis.queue_store import QueueStore

#: the current rate covers this much of the recent past (s)
WINDOW_S = 1.0
#: the recent rate covers this much (s)
LONG_WINDOW_S = 10.0
#: published at most this often (s)
PUBLISH_EVERY_S = 0.25
#: points closer together than this are not kept (s)
POINT_EVERY_S = 0.05
#: a rate needs at least this much history (s) ...
MIN_SPAN_S = 0.1
#: ... except that a replica says what it knows at least this often while it ticks (s)
IDLE_PUBLISH_S = 1.0


class _Window:
    """Points (time, cumulative count) of the last `span_s`; the rate over them."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.points: deque[tuple[float, int]] = deque()

    def rate(self, now: float, count: int) -> float | None:
        points = self.points
        if points and now - points[-1][0] > self.span_s:
            points.clear()  # idle for a whole window: what comes now starts a fresh one
        if not points or now - points[-1][0] >= POINT_EVERY_S:
            points.append((now, count))
        while len(points) > 2 and now - points[1][0] >= self.span_s:
            points.popleft()
        start, first = points[0]
        elapsed = now - start
        if elapsed < MIN_SPAN_S:
            return None
        return max(0, count - first) / elapsed


class DrainMeter:
    """Owns this replica's dispatch-rate windows and its entry in the shared drain record."""

    def __init__(
        self,
        queues: QueueStore,
        dispatched: Callable[[], int],
        *,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queues = queues
        self.dispatched = dispatched
        self.replica = replica or uuid.uuid4().hex[:12]
        self._clock = clock
        self._now = _Window(WINDOW_S)
        self._recent = _Window(LONG_WINDOW_S)
        self._published_at = -PUBLISH_EVERY_S
        self.rate_per_s = 0.0

    async def tick(self) -> None:
        """After a dispatch round: publishes the rate when it is time to."""
        now, count = self._clock(), self.dispatched()
        current = self._now.rate(now, count)
        recent = self._recent.rate(now, count)
        since = now - self._published_at
        if since < PUBLISH_EVERY_S or (current is None and since < IDLE_PUBLISH_S):
            return
        self._published_at = now
        self.rate_per_s = max(current or 0.0, recent or 0.0)
        await self.queues.publish_drain(self.replica, self.rate_per_s)


__all__ = ["DrainMeter"]
