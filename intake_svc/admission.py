"""How long a refused caller should wait before trying again.

Over the global limit the seed's constant applies (retry_after_s, 30 s). Over a device's own limit the
delay is what that device needs to drain below its limit at its recent service rate, within
[1 s, max_wait]; a device never served yet gets the global delay.
"""

from __future__ import annotations

import time

from sieve.errors import AdmissionRefused
from sieve.settings import Settings

MIN_RETRY_S = 1.0


def device_retry_after_s(meta: dict[str, str], incoming: int, settings: Settings,
                         now_ms: int | None = None) -> float:
    """Seconds until a device with this meta has room for `incoming` more tasks, at its service rate."""
    now_ms = now_ms or int(time.time() * 1000)
    backlog = int(meta.get("backlog", 0))
    excess = max(1, backlog + incoming - settings.max_per_device_pending)
    rate = float(meta.get("rate_per_s", 0) or 0)
    win_start = int(meta.get("win_start_ms", 0) or 0)
    if win_start and now_ms - win_start >= 1000:
        current = int(meta.get("win_count", 0) or 0) * 1000 / (now_ms - win_start)
        rate = max(rate, current)
    delay = settings.retry_after_s if rate <= 0 else excess / rate
    return min(max(delay, MIN_RETRY_S), settings.aging_max_wait_s)


def retry_after_s(refusal: AdmissionRefused, meta: dict[str, str], incoming: int,
                  settings: Settings) -> float:
    if refusal.is_global:
        return settings.retry_after_s
    return device_retry_after_s(meta, incoming, settings)
