"""Backpressure: whether this worker holds back now, why, since when, and for how long in all.

A worker that is short of CPU, memory or GPU memory stops asking for work instead of taking it and failing or
slowing every task it holds; the scheduler then hands that work to workers with room.

The rule (the README's "Configuration" section gives the reasoning):

- a worker holds back — sends no credits, and puts back at once what reaches it anyway — while a reading is at
  or over its watermark: CPU used by *other* processes in its domain (its cgroup's quota, else its host's cores;
  its own process tree is left out, its concurrency bounds that, and so are the platform's own other processes,
  the other Sieve services and workers and the Redis and PostgreSQL servers beside it), memory in use in its
  domain (all of it, the worker's own included: memory is not time-shared and the limit kills whoever fills it),
  GPU memory held by other processes;
- CPU holds it back only once it has stayed at or over its watermark for `CPU_ENTER_AFTER_S` (CPU is shared
  by time: a burst of others' work slows this worker's tasks a little, it does not endanger them), memory and
  GPU memory at once (what fills them gets killed);
- it takes work again once every reading is `watermark_hysteresis_pct` points under its watermark (so that a
  reading hovering at the watermark does not make it flap);
- CPU is read over the last second (`worker_svc.resources.CPU_WINDOW_S`) and sampled at most every
  `SAMPLE_EVERY_S`, so the check is cheap enough to make before every credit and every batch, and a load that
  stops is seen within a second or so.

Each change of what holds the worker back is logged once (not per batch); the time held back is kept per
resource for the metrics (`held_back_seconds`). A task put back under pressure waits `retry_after_s()`: about
as long again as the pressure has lasted so far (a pressure that just began is expected to pass soon), at least
`MIN_RETRY_S`, at most `pressure_retry_s`, jittered.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from sieve.redis.worker_records import WATERMARK_RESOURCES, watermark_levels
from sieve.settings import Settings
from sieve.v1 import registry_pb2
from worker_svc.resources import ResourceSampler

log = logging.getLogger("sieve.worker.pressure")

SAMPLE_EVERY_S = 0.25
#: CPU over its watermark holds the worker back once it has stayed there this long (s)
CPU_ENTER_AFTER_S = 2.0
#: shortest delay of a task put back under pressure
MIN_RETRY_S = 1.0
#: a put-back's delay is spread over [1 - JITTER, 1 + JITTER] x the estimate
JITTER = 0.2


class Pressure:
    """Owns this worker's hold-back state: which resources hold it back (with hysteresis), since when, the
    time held back so far per resource, and the retry delay of tasks it puts back."""

    def __init__(
        self,
        sampler: ResourceSampler,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.sampler = sampler
        self.settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._reasons: list[str] = []
        self._sampled_at = -SAMPLE_EVERY_S
        self.last: registry_pb2.Resources | None = None
        #: resource -> when it started holding the worker back (monotonic s)
        self._since: dict[str, float] = {}
        #: resource -> since when it has been over its watermark without holding the worker back yet
        self._over_since: dict[str, float] = {}
        #: time held back by each resource in episodes that have ended (s)
        self._ended: dict[str, float] = dict.fromkeys(WATERMARK_RESOURCES, 0.0)
        #: since when the worker holds back at all (None: it takes work)
        self.held_since: float | None = None
        #: how many times the worker started holding back
        self.episodes = 0

    @property
    def held(self) -> bool:
        return self.held_since is not None

    def held_resources(self) -> list[str]:
        """The resources holding the worker back now."""
        return [r for r in WATERMARK_RESOURCES if self._since.get(r) is not None]

    def held_back_seconds(self) -> dict[str, float]:
        """Seconds held back so far by each resource, the current episode included."""
        now = self._clock()
        out: dict[str, float] = {}
        for r in WATERMARK_RESOURCES:  # read from the metrics thread too: .get, never [] on _since
            since = self._since.get(r)
            out[r] = self._ended[r] + (now - since if since is not None else 0.0)
        return out

    def reasons(self, active_tasks: int = 0) -> list[str]:
        """Why the worker must not take work now (empty when it may)."""
        now = self._clock()
        if now - self._sampled_at >= SAMPLE_EVERY_S:
            self._sampled_at = now
            self.last = self.sampler.sample(active_tasks)
            self._judge(self.last, now)
        return self._reasons

    def _judge(self, readings: registry_pb2.Resources, now: float) -> None:
        hysteresis = max(0.0, self.settings.watermark_hysteresis_pct)
        reasons: list[str] = []
        over: set[str] = set()
        for level in watermark_levels(readings, self.settings):
            holding = level.resource in self._since
            # a resource that holds the worker back lets go only `hysteresis` points under its watermark
            threshold = level.watermark - hysteresis if holding else level.watermark
            if level.value < threshold:
                self._over_since.pop(level.resource, None)
                continue
            if not holding and level.resource == "cpu":
                first = self._over_since.setdefault(level.resource, now)
                if now - first < CPU_ENTER_AFTER_S:
                    continue
            self._over_since.pop(level.resource, None)
            over.add(level.resource)
            reasons.append(level.describe(None if level.value >= level.watermark else threshold))
        before = set(self._since)
        for resource in before - over:
            self._ended[resource] += now - self._since.pop(resource)
        for resource in over - before:
            self._since[resource] = now
        self._reasons = reasons
        if over == before:
            return
        if not before:
            self.held_since = now
            self.episodes += 1
            log.warning(
                "holding back (no new work): %s",
                "; ".join(reasons),
                extra={"held_back": sorted(over), "readings_scope": readings.scope},
            )
        elif not over:
            held_s = now - (self.held_since or now)
            self.held_since = None
            log.warning(
                "taking work again after %.1fs held back (%s)",
                held_s,
                ", ".join(sorted(before)),
                extra={"held_back_s": round(held_s, 3)},
            )
        else:
            log.info("still holding back, now for: %s", "; ".join(reasons), extra={"held_back": sorted(over)})

    def retry_after_s(self) -> float:
        """How long a task put back under pressure should wait: about as long again as the pressure has
        lasted, within [MIN_RETRY_S, pressure_retry_s], jittered so that put-backs do not return together."""
        lasted = 0.0 if self.held_since is None else self._clock() - self.held_since
        ceiling = max(MIN_RETRY_S, self.settings.pressure_retry_s)
        estimate = min(max(lasted, MIN_RETRY_S), ceiling)
        return min(ceiling, max(MIN_RETRY_S, estimate * self._rng.uniform(1 - JITTER, 1 + JITTER)))


__all__ = ["CPU_ENTER_AFTER_S", "MIN_RETRY_S", "SAMPLE_EVERY_S", "Pressure"]
