"""Backpressure (seed 5.2): whether this worker is over a CPU / memory / GPU-memory watermark.

Readings are sampled at most every `SAMPLE_EVERY_S` so the check is cheap enough to make before every
credit and every batch.
"""

from __future__ import annotations

import time

from sieve.settings import Settings
from sieve.v1 import registry_pb2
from worker_svc.resources import ResourceSampler, over_watermark

SAMPLE_EVERY_S = 0.25


class Pressure:
    def __init__(self, sampler: ResourceSampler, settings: Settings) -> None:
        self.sampler = sampler
        self.settings = settings
        self._reasons: list[str] = []
        self._sampled_at = 0.0
        self.last: registry_pb2.Resources | None = None

    def reasons(self, active_tasks: int = 0) -> list[str]:
        """Why the worker must not take work now (empty when it may)."""
        now = time.monotonic()
        if now - self._sampled_at >= SAMPLE_EVERY_S:
            self.last = self.sampler.sample(active_tasks)
            self._reasons = over_watermark(self.last, self.settings)
            self._sampled_at = now
        return self._reasons
