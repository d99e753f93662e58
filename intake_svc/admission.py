"""How long a refused caller should wait before trying again (the RetryInfo of a RESOURCE_EXHAUSTED).

- Over the global limit: about when enough room will be free for this request at the rate the queues drain
  now — (pending + incoming - limit) / drain rate, where the drain rate is what the scheduler replicas took
  from the queues over the last second (`scheduler_svc.drain`, read at most every `RATE_CACHE_S`) — jittered
  by +-`GLOBAL_JITTER` so that refused clients do not all come back at once, within
  [`MIN_GLOBAL_RETRY_S`, retry_after_s]. When no replica dispatched anything in the last `RATE_FRESH_S`, the
  queues are not draining now (every worker full or holding back, or none connected): the delay is about as
  long again as that pause has lasted (from 1 s, up to the maximum). When no replica has published a rate at
  all (a fresh installation whose first tasks are not dispatched yet, or none for a day) nothing is known: 1 s.
  All jittered the same way.
- Over a device's own limit: what that device needs to drain below its limit at its recent service rate,
  within [1 s, max_wait]. A window of serves shorter than a second counts from `WINDOW_FLOOR_MS` (a device served
  ten tasks in its first 0.2 s is served at about 40/s, not at an unknown rate). A device never served yet is
  counted at its fair share of what the queues drain now (the drain rate over the active devices); with no drain
  measured, 1 s ("come back soon and see", as for a global refusal) — never the configured maximum for a device
  the scheduler may serve within the second.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from sieve.errors import AdmissionRefused
from sieve.redis.queue_store import Drain, QueueStore, now_ms
from sieve.settings import Settings

MIN_RETRY_S = 1.0
#: shortest delay of a global refusal (a drain this fast is worth coming back for at once)
MIN_GLOBAL_RETRY_S = 0.1
#: a global refusal's delay is spread over [1 - JITTER, 1 + JITTER] x the estimate
GLOBAL_JITTER = 0.15
#: the drain rate is read from Redis at most this often
RATE_CACHE_S = 0.25
#: a replica's published rate older than this is not counted (it dispatches nothing now)
RATE_FRESH_S = 3.0
#: shortest delay while the queues are not draining
PAUSED_MIN_RETRY_S = 1.0
#: a device's current window of serves counts as at least this long (its first serves come within ms)
WINDOW_FLOOR_MS = 250


def device_retry_after_s(
    meta: dict[str, str],
    incoming: int,
    settings: Settings,
    now_ms: int | None = None,
    fair_rate_per_s: float | None = None,
) -> float:
    """Seconds until a device with this meta has room for `incoming` more tasks, at its service rate (a device
    never served yet: at `fair_rate_per_s`, its share of the drain now; unknown, 1 s)."""
    now_ms = now_ms or int(time.time() * 1000)
    backlog = int(meta.get("backlog", 0))
    excess = max(1, backlog + incoming - settings.max_per_device_pending)
    rate = float(meta.get("rate_per_s", 0) or 0)
    # the claim scripts write times in ms with a fraction (queue_store.now_ms: 0.1 ms), e.g. "1796220473900.4"
    win_start = int(float(meta.get("win_start_ms", 0) or 0))
    if win_start:
        current = int(meta.get("win_count", 0) or 0) * 1000 / max(now_ms - win_start, WINDOW_FLOOR_MS)
        rate = max(rate, current)
    if rate <= 0:
        rate = fair_rate_per_s or 0.0
    delay = PAUSED_MIN_RETRY_S if rate <= 0 else excess / rate
    return min(max(delay, MIN_RETRY_S), settings.aging_max_wait_s)


def global_retry_after_s(
    pending: int,
    incoming: int,
    drain: Drain,
    settings: Settings,
    rng: random.Random | None = None,
    now: float | None = None,
) -> float:
    """Seconds until the global backlog has room for `incoming` more tasks at the measured drain, jittered and
    bounded by retry_after_s (see the module's docstring for a pause in draining)."""
    uniform = rng.uniform if rng is not None else random.uniform
    ceiling = max(MIN_GLOBAL_RETRY_S, settings.retry_after_s)
    jitter = uniform(1 - GLOBAL_JITTER, 1 + GLOBAL_JITTER)
    if drain.rate_per_s is not None and drain.rate_per_s > 0:
        excess = max(1, pending + incoming - settings.max_total_pending)
        return min(ceiling, max(MIN_GLOBAL_RETRY_S, excess / drain.rate_per_s * jitter))
    if drain.last_ms is None:  # never measured (or not for a day): come back soon and see
        return min(ceiling, PAUSED_MIN_RETRY_S * jitter)
    paused_s = max(0.0, ((now or now_ms()) - drain.last_ms) / 1000)
    return min(ceiling, max(PAUSED_MIN_RETRY_S, paused_s) * jitter)


class RetryAdvisor:
    """Answers the retry delay of each refusal; owns the cached reading of the global drain rate."""

    def __init__(
        self,
        queues: QueueStore,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.queues = queues
        self.settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._drain = Drain(None, None)
        self._read_at = -RATE_CACHE_S

    async def drain(self) -> Drain:
        """How fast the queues drain now; read from Redis at most every RATE_CACHE_S."""
        now = self._clock()
        if now - self._read_at >= RATE_CACHE_S:
            self._read_at = now
            self._drain = await self.queues.drain_rate(fresh_ms=RATE_FRESH_S * 1000)
        return self._drain

    async def after_s(self, refusal: AdmissionRefused, meta: dict[str, str], incoming: int) -> float:
        """The delay to tell a caller refused with `refusal` for `incoming` tasks (`meta`: the device's, for a
        device refusal)."""
        if refusal.is_global:
            return global_retry_after_s(refusal.pending, incoming, await self.drain(), self.settings, self._rng)
        fair: float | None = None
        if not meta.get("rate_per_s") and not meta.get("win_start_ms"):  # never served: its share of the drain
            drain = await self.drain()
            if drain.rate_per_s:
                fair = drain.rate_per_s / max(1, await self.queues.active_devices())
        return device_retry_after_s(meta, incoming, self.settings, fair_rate_per_s=fair)


__all__ = ["RetryAdvisor", "device_retry_after_s", "global_retry_after_s"]
