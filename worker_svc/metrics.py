"""A worker's scrape-time metrics: slots, in-flight tasks, credits, utilisation, its resource readings.

All from memory: the Puller's counters, the runner's skipped / refused counts, and the readings the
worker last sent the registry (sampled every heartbeat; a scrape does not sample again, which would
shorten the CPU measurement window of the next heartbeat).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from sieve import metrics as m
from sieve.metrics import ScrapeCollector
from worker_svc.resources import over_watermark

if TYPE_CHECKING:
    from worker_svc.server import Worker


class WorkerCollector(ScrapeCollector):
    def __init__(self, worker: Worker) -> None:
        super().__init__()
        self.worker = worker

    def now(self) -> Iterable[Metric]:
        puller = self.worker.puller
        runner = self.worker.runner
        slots = max(0, int(puller.concurrency))
        yield m.WORKER_SLOTS.family(slots)
        yield m.WORKER_IN_FLIGHT.family(puller.in_use)
        yield m.WORKER_CREDITS.family(puller.credits_granted)
        yield m.WORKER_UTILISATION.family(puller.in_use / slots if slots else 0.0)
        yield m.WORKER_CONNECTED.family(1 if puller.connected.is_set() else 0)
        yield m.WORKER_COMPLETED.family(puller.completed)
        yield m.WORKER_SKIPPED.family(runner.skipped)
        yield m.WORKER_REFUSED.family(runner.refused)
        # rows per write is the group commit's gain: how many tasks shared one statement and one commit
        writers = (runner.starts, runner.results)
        yield m.WORKER_DB_WRITES.family([((w.name,), w.groups) for w in writers])
        yield m.WORKER_DB_ROWS.family([((w.name,), w.rows) for w in writers])
        readings = self.worker.registry.last_resources
        if readings is not None:
            yield m.WORKER_RESOURCES.family([
                (("cpu",), readings.cpu_percent), (("memory",), readings.memory_percent),
                (("gpu_memory",), readings.gpu_memory_percent), (("gpu_util",), readings.gpu_util_percent)])
            yield m.WORKER_OVER_WATERMARK.family(1 if over_watermark(readings, self.worker.settings) else 0)


__all__ = ["WorkerCollector"]
