"""What the console's JSON API answers, read through the scheduler's own stores (Redis only via sieve/redis).

`Views.overview` is one answer with everything the page shows: the queue totals (the gauges GetWatermark reads),
PENDING tasks by priority and type (PostgreSQL, as the metrics scrape reads them; re-read at most every
`SLOW_READ_S`), the devices that waited longest (`QueueStore.longest_waiting`), those this replica served most in
the last minute and a random sample of the active ones (`QueueStore.device_views`), with their wait, share and
entitlement, the live workers with their
readings (the registry's records), the newest dead letters, the slot pools, and the samples of `History`.

An answer is built at most once a second (`MIN_AGE_S`) whatever the number of pages open: concurrent requests
share one read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler_svc.console.history import SHARE_WINDOW_S, History
from scheduler_svc.dead_letters import DeadLetters, Filter
from sieve.db.tasks import TaskStore
from sieve.enums import enum_label
from sieve.redis.keys import PRIORITIES
from sieve.redis.queue_store import DeviceView, QueueStore
from sieve.redis.scheduler_state import SchedulerState
from sieve.redis.slot_pools import SlotPools
from sieve.redis.worker_records import WorkerRecord, WorkerRecords
from sieve.v1.types_pb2 import Priority, TaskType

#: devices listed at most, and how many active ones each shard is sampled for besides those served recently
LISTED_DEVICES = 50
SAMPLED_DEVICES = 50
#: dead letters listed
LISTED_DEAD_LETTERS = 10
#: an answer younger than this is served again
MIN_AGE_S = 1.0
#: PENDING by class (a grouped count in PostgreSQL) is re-read at most this often
SLOW_READ_S = 5.0

PRIORITY_NAMES = [enum_label(Priority, p) for p in PRIORITIES]


@dataclass(frozen=True, slots=True)
class Parts:
    """The stores and in-memory parts the console reads."""

    state: SchedulerState
    queues: QueueStore
    records: WorkerRecords
    dead_letters: DeadLetters
    tasks: TaskStore
    history: History
    weight_of: Callable[[str], int]
    connected_workers: Callable[[], int]
    #: tasks this replica saw acked since it started
    acked: Callable[[], int]
    replica: str
    #: None while no slot pools are configured for this installation
    pools: SlotPools | None = None


def _device_rows(views: Sequence[DeviceView], history: History, weight_of: Callable[[str], int]) -> list[Any]:
    served, total = history.shares()
    now_ms = time.time() * 1000
    contending = [v for v in views if sum(v.queued) or served.get(v.mac)]
    weights = sum(weight_of(v.mac) for v in contending) or 1
    rows: list[dict[str, Any]] = []
    for v in contending:
        oldest, since = v.oldest_enqueued_ms, v.ready_since_ms
        rows.append(
            {
                "device": v.mac,
                "weight": weight_of(v.mac),
                "queued": dict(zip(PRIORITY_NAMES, v.queued, strict=True)),
                "queued_total": sum(v.queued),
                # the wait the fair order reads (None: not ready: being served, in backoff, or nothing queued)
                "wait_s": None if since is None else round(max(0.0, now_ms - since) / 1000, 3),
                "oldest_task_s": None if oldest is None else round(max(0.0, now_ms - oldest) / 1000, 3),
                "served": served.get(v.mac, 0),
                "share": round(served.get(v.mac, 0) / total, 4) if total else 0.0,
                "entitlement": round(weight_of(v.mac) / weights, 4),
                "overloaded": v.overloaded,
                "backoff": v.backoff_until_ms is not None,
            }
        )
    rows.sort(key=lambda r: (-(r["wait_s"] or -1), -(r["oldest_task_s"] or 0), -r["served"], r["device"]))
    return rows[:LISTED_DEVICES]


def _worker_row(r: WorkerRecord, now: datetime) -> dict[str, Any]:
    return {
        "worker_id": r.worker_id,
        "hostname": r.hostname,
        "task_types": [enum_label(TaskType, t) for t in r.task_types],
        "cpu_percent": round(r.cpu_percent, 1),
        "memory_percent": round(r.memory_percent, 1),
        "gpu_count": r.gpu_count,
        "gpu_names": list(r.gpu_names),
        "gpu_util_percent": round(r.gpu_util_percent, 1),
        "gpu_memory_percent": round(r.gpu_memory_percent, 1),
        "active_tasks": r.active_tasks,
        "concurrency": r.concurrency,
        "available": r.available,
        "unavailable_reasons": list(r.unavailable_reasons),
        "heartbeat_age_s": round((now - r.last_heartbeat).total_seconds(), 1),
    }


class Views:
    """Builds the console's answers (see the module)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._built: tuple[float, dict[str, Any]] | None = None
        self._building: asyncio.Task[dict[str, Any]] | None = None
        self._pending_by_class: tuple[float, list[tuple[int, str, int]]] | None = None

    async def overview(self) -> dict[str, Any]:
        """The latest answer, built anew when older than MIN_AGE_S (one build at a time, shared)."""
        if self._built is not None and time.monotonic() - self._built[0] < MIN_AGE_S:
            return self._built[1]
        # a build left done by a request that went away before it ended is not reused: its answer may be old
        if self._building is None or self._building.done():
            self._building = asyncio.create_task(self._build())
        building = self._building
        answer = await asyncio.shield(building)  # a request that goes away leaves the build to the others
        if self._building is building:
            self._building = None
            self._built = (time.monotonic(), answer)
        return answer

    async def _classes(self) -> list[tuple[int, str, int]]:
        cached = self._pending_by_class
        if cached is None or time.monotonic() - cached[0] >= SLOW_READ_S:
            cached = self._pending_by_class = (time.monotonic(), await self.parts.tasks.pending_by_class())
        return cached[1]

    async def _pools(self) -> dict[str, Any]:
        # slot pools (SIEVE_EXTERNAL_PROVIDERS): what ListSlotPools shows, read through sieve/redis/slot_pools.py
        if self.parts.pools is None:
            return {"configured": False, "pools": []}
        states = await self.parts.pools.states()
        return {
            "configured": True,
            "pools": [
                {
                    "name": s.name,
                    "max_slots": s.max_slots,
                    "in_use": s.in_use,
                    "holders": [{"holder": h, "lease_until_ms": ms} for h, ms in sorted(s.holders.items())],
                }
                for s in states
            ],
        }

    async def _build(self) -> dict[str, Any]:
        p = self.parts
        served, _ = p.history.shares()
        longest = await p.queues.longest_waiting(LISTED_DEVICES)
        busiest = [mac for mac, _n in served.most_common(LISTED_DEVICES)]
        gauges, rank, views, workers, letters, classes = await asyncio.gather(
            p.state.gauges(),
            p.queues.rank(),
            p.queues.device_views(sample=SAMPLED_DEVICES, also=[*longest, *busiest]),
            p.records.list(),
            p.dead_letters.page(Filter(), LISTED_DEAD_LETTERS),
            self._classes(),
        )
        pools = await self._pools()
        now = datetime.now(UTC)
        queues: dict[str, dict[str, int]] = {name: {} for name in reversed(PRIORITY_NAMES)}
        for priority, task_type, n in classes:
            queues.setdefault(enum_label(Priority, priority), {})[task_type] = n
        records, total_dead = letters
        return {
            "at_ms": int(time.time() * 1000),
            "replica": p.replica,
            "share_window_s": SHARE_WINDOW_S,
            "totals": {
                "pending": gauges.pending,
                "leased": gauges.leased,
                "delayed": gauges.delayed,
                "devices": gauges.devices,
                "overloaded": gauges.overloaded,
                "backoff": gauges.backoff,
                "dead_letters": gauges.dead_letters,
                "oldest_wait_s": round((rank.longest_wait_ms or 0) / 1000, 3),
                "live_workers": len(workers),
                "connected_workers": p.connected_workers(),
                "acked_here": p.acked(),
            },
            "queues": [{"priority": name, "pending": by_type} for name, by_type in queues.items()],
            "devices": _device_rows(views, p.history, p.weight_of),
            "workers": [_worker_row(r, now) for r in workers],
            "dead_letters": {
                "total": total_dead,
                "recent": [
                    {
                        "task_id": r["task_id"],
                        "device": r["device"],
                        "type": enum_label(TaskType, int(r["task_type"])),
                        "error": str(r.get("error", ""))[:200],
                        "attempts": r.get("attempts", 0),
                        "dead_ms": int(r.get("dead_ms", 0)),
                    }
                    for r in records
                ],
            },
            "slot_pools": pools,
            "history": [s.to_json() for s in p.history.samples],
        }


__all__ = ["LISTED_DEVICES", "Parts", "Views"]
