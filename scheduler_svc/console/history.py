"""One sample a second of what this replica's dispatch loop did, kept for the console's charts.

Each sample (`Sample`) holds: tasks claimed and acked in that second (throughput), the queue-wait percentiles of
the tasks claimed (enqueue to claim: the scheduler's own part of a task's latency), the queue totals read from
Redis, and Jain's index of fairness over the devices served in the last `FAIRNESS_WINDOW_S` seconds.

Jain's index is (sum x)^2 / (n * sum x^2) over the n devices served in the window, x being a device's tasks
claimed divided by its weight: 1.0 when every device got what its weight entitles it to, 1/n when one device got
everything. It looks at the devices this replica served only (with several replicas, each console shows its own),
and it is meaningful while those devices are backlogged: a device with little work takes less than its share.

Per-device shares over the last `SHARE_WINDOW_S` seconds (`shares`) are what the devices table shows next to
each device's entitlement (its weight over the weights of the devices contending with it). A second keeps at most
`MAX_DEVICES_PER_SECOND` devices by name, the busiest (Jain's index covers those); the rest count in the totals.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass

from scheduler_svc.console.tally import Tally

log = logging.getLogger("sieve.scheduler.console")

#: how many one-second samples are kept (the charts' span: 5 minutes)
KEEP_SAMPLES = 300
#: the window Jain's index of each sample is computed over (s)
FAIRNESS_WINDOW_S = 10
#: the window of the per-device shares the devices table shows (s)
SHARE_WINDOW_S = 60
#: devices a second's sample keeps by name at most (the busiest); the others count in the totals only. Bounds the
#: memory of the windows (60 seconds of 2 000 devices) when tens of thousands of devices are served each second
MAX_DEVICES_PER_SECOND = 2000


@dataclass(frozen=True, slots=True)
class Totals:
    """The queue totals of one moment (read from Redis by the caller of `History.run`)."""

    pending: int
    leased: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One second of this replica's dispatching (see the module)."""

    #: when the second ended (ms since the epoch)
    at_ms: int
    claimed_per_s: float
    acked_per_s: float
    wait_p50_ms: float | None
    wait_p95_ms: float | None
    wait_max_ms: float | None
    #: Jain's index over the last FAIRNESS_WINDOW_S; None with fewer than two devices served
    jain: float | None
    devices_served: int
    pending: int
    leased: int

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q` quantile of sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def jain_index(allocations: Sequence[float]) -> float | None:
    """Jain's fairness index of the allocations (1.0: all equal); None with fewer than two."""
    values = [v for v in allocations if v >= 0]
    if len(values) < 2:
        return None
    total, squares = sum(values), sum(v * v for v in values)
    if squares == 0:
        return None
    return total * total / (len(values) * squares)


class History:
    """Takes the tally once a second and keeps the samples (see the module)."""

    def __init__(
        self,
        tally: Tally,
        *,
        acked: Callable[[], int],
        weight_of: Callable[[str], int],
        totals: Callable[[], Awaitable[Totals]],
        interval_s: float = 1.0,
    ) -> None:
        self.tally = tally
        self.acked = acked
        self.weight_of = weight_of
        self.totals = totals
        self.interval_s = interval_s
        self.samples: deque[Sample] = deque(maxlen=KEEP_SAMPLES)
        #: per-device claims of each recent second, newest last (the share and fairness windows)
        self._seconds: deque[Counter[str]] = deque(maxlen=max(SHARE_WINDOW_S, FAIRNESS_WINDOW_S))
        self._window: Counter[str] = Counter()
        #: tasks of the devices not kept by name (over MAX_DEVICES_PER_SECOND in their second), per second
        self._others: deque[int] = deque(maxlen=self._seconds.maxlen)
        self._last_acked = acked()
        self._last_at = time.monotonic()
        self._last_totals = Totals(0, 0)

    def shares(self) -> tuple[Counter[str], int]:
        """Tasks claimed per device over the last SHARE_WINDOW_S seconds (the devices kept by name), and the sum
        of every device's."""
        return self._window, sum(self._window.values()) + sum(self._others)

    def fairness(self) -> tuple[float | None, int]:
        """Jain's index over the last FAIRNESS_WINDOW_S seconds of claims (x = claims / weight), and how many
        devices it covers."""
        recent: Counter[str] = Counter()
        for second in list(self._seconds)[-FAIRNESS_WINDOW_S:]:
            recent.update(second)
        return jain_index([n / max(1, self.weight_of(mac)) for mac, n in recent.items()]), len(recent)

    async def sample(self) -> Sample:
        """Takes the tally: one more sample."""
        now = time.monotonic()
        elapsed = max(1e-3, now - self._last_at)
        self._last_at = now
        taken = self.tally.take()
        claimed = sum(taken.per_device.values())
        kept = taken.per_device
        if len(kept) > MAX_DEVICES_PER_SECOND:
            kept = Counter(dict(kept.most_common(MAX_DEVICES_PER_SECOND)))
        if len(self._seconds) == self._seconds.maxlen:
            self._window.subtract(self._seconds[0])
            self._window = +self._window  # drops the devices that fell to 0
        self._seconds.append(kept)
        self._others.append(claimed - sum(kept.values()))
        self._window.update(kept)
        acked = self.acked()
        acked_now, self._last_acked = acked - self._last_acked, acked
        try:
            self._last_totals = await self.totals()
        except Exception as exc:  # a Redis hiccup leaves the last totals in this sample
            log.debug("console: totals not read: %s", exc)
        waits = sorted(taken.waits_ms)
        jain, served = self.fairness()
        sample = Sample(
            at_ms=int(time.time() * 1000),
            claimed_per_s=round(claimed / elapsed, 2),
            acked_per_s=round(max(0, acked_now) / elapsed, 2),
            wait_p50_ms=quantile(waits, 0.5),
            wait_p95_ms=quantile(waits, 0.95),
            wait_max_ms=waits[-1] if waits else None,
            jain=None if jain is None else round(jain, 4),
            devices_served=served,
            pending=self._last_totals.pending,
            leased=self._last_totals.leased,
        )
        self.samples.append(sample)
        return sample

    async def run(self) -> None:
        """Samples once every interval until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sample()
            except Exception:
                log.exception("console: sample failed")


__all__ = [
    "FAIRNESS_WINDOW_S",
    "KEEP_SAMPLES",
    "MAX_DEVICES_PER_SECOND",
    "SHARE_WINDOW_S",
    "History",
    "Sample",
    "Totals",
    "jain_index",
    "quantile",
]
