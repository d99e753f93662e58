"""The registry's scrape-time metrics: live workers by task type and availability, and the fleet's load.

One SCAN of the worker records per scrape (as ListWorkers does); the readings are summed or averaged over
the fleet, never labelled per worker.
"""

from __future__ import annotations

from collections import Counter

from prometheus_client.core import Metric

from sieve.enums import enum_name
from sieve.observe import metrics as m
from sieve.observe.metrics import ScrapeCollector
from sieve.redis.worker_records import WorkerRecords
from sieve.v1 import types_pb2

#: (resource label, WorkerRecord attribute)
_READINGS = (
    ("cpu", "cpu_percent"),
    ("memory", "memory_percent"),
    ("gpu_memory", "gpu_memory_percent"),
    ("gpu_util", "gpu_util_percent"),
)


class RegistryCollector(ScrapeCollector):
    """Reads the fleet's numbers from the worker records at scrape time (one SCAN per scrape)."""

    def __init__(self, records: WorkerRecords) -> None:
        super().__init__()
        self.records = records

    async def read(self) -> list[Metric]:
        workers = await self.records.list()
        by_class: Counter[tuple[str, str]] = Counter()
        for w in workers:
            for t in w.task_types:
                by_class[(enum_name(types_pb2.TaskType, t), "true" if w.available else "false")] += 1
        resources: list[tuple[tuple[str, str], float]] = []
        for label, attribute in _READINGS:
            values = [float(getattr(w, attribute)) for w in workers] or [0.0]
            resources += [((label, "avg"), sum(values) / len(values)), ((label, "max"), max(values))]
        return [
            m.WORKERS.family(by_class.items()),
            m.FLEET_ACTIVE_TASKS.family(sum(w.active_tasks for w in workers)),
            m.FLEET_RESOURCES.family(resources),
        ]


__all__ = ["RegistryCollector"]
