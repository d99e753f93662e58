"""A worker's scrape-time metrics: slots, in-flight tasks, credits, utilisation, its resource readings, and
whether (and how long in all) it held back under pressure, by resource.

All from memory: the Puller's counters, the runner's skipped / refused counts, the pressure state, and the
readings the pressure check last took (a scrape does not sample again).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from sieve.observe import metrics as m
from sieve.observe.metrics import ScrapeCollector
from sieve.redis.worker_records import WATERMARK_RESOURCES

if TYPE_CHECKING:
    from worker_svc.app import WorkerApp


class WorkerCollector(ScrapeCollector):
    """Reads one worker's numbers at scrape time."""

    def __init__(self, worker: WorkerApp) -> None:
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
        writers = runner.writers
        yield m.WORKER_DB_WRITES.family([((w.name,), w.groups) for w in writers])
        yield m.WORKER_DB_ROWS.family([((w.name,), w.rows) for w in writers])
        pressure = puller.pressure
        readings = pressure.last or self.worker.registry.last_resources
        if readings is not None:
            yield m.WORKER_RESOURCES.family(
                [
                    (("cpu",), readings.cpu_percent),
                    (("cpu_own",), readings.cpu_own_percent),
                    (("cpu_platform",), readings.cpu_platform_percent),
                    (("memory",), readings.memory_percent),
                    (("gpu_memory",), readings.gpu_memory_percent),
                    (("gpu_memory_own",), readings.gpu_memory_own_percent),
                    (("gpu_util",), readings.gpu_util_percent),
                ]
            )
        held = set(pressure.held_resources())
        yield m.WORKER_OVER_WATERMARK.family(1 if held else 0)
        yield m.WORKER_HELD_BACK.family([((r,), 1 if r in held else 0) for r in WATERMARK_RESOURCES])
        yield m.WORKER_HELD_BACK_SECONDS.family([((r,), s) for r, s in pressure.held_back_seconds().items()])
        yield m.WORKER_PRESSURE_PUT_BACK.family(puller.pressure_nacks)
        yield m.WORKER_ABANDONED.family(runner.abandoned)
        yield m.WORKER_LINGERING.family(len(runner.holds))


__all__ = ["WorkerCollector"]
