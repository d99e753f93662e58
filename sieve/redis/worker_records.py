"""Worker records in Redis: registration, heartbeat, listing, and availability.

Owns the registry's storage, which the registry service writes and the scheduler reads:

- one HASH per worker at `Keys.worker(worker_id)` with an expiry of `worker_ttl_s`; a worker is alive
  exactly as long as its hash exists (a missed heartbeat lets it expire, nothing has to delete it);
- the sorted set `Keys.worker_index`: worker id -> expiry deadline (epoch ms), refreshed with the hash,
  so the number of live workers is one ZCARD after pruning past deadlines (no scan);
- `availability`: the CPU / memory / GPU-memory watermark check, shared by the registry (is a worker
  available?) and the worker itself (should it hold back credits?).

Hash fields are strings: numbers in decimal, booleans "1"/"0", `task_types` a comma list of TaskType
names without their prefix ("TEXT,OCR_IMAGE"), `gpu_names` a JSON array of strings (GPU names may hold
commas), times ISO-8601 UTC. Listing reads the ids of the index whose deadline has not passed (never a SCAN
of the keyspace, which holds every device's keys too) and each page's hashes in one pipeline.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol, cast

from google.protobuf import timestamp_pb2
from redis.asyncio import Redis
from redis.exceptions import WatchError

from sieve.enums import enum_name
from sieve.redis.keys import Keys
from sieve.redis.reply import reply
from sieve.settings import Settings
from sieve.v1 import registry_pb2, types_pb2

log = logging.getLogger("sieve.redis.worker_records")

#: ids of the index read per pipeline of HGETALLs.
PAGE_SIZE = 500
_TASK_TYPE_PREFIX = "TASK_TYPE_"


class ResourceLevels(Protocol):
    """The readings the watermarks apply to (a `WorkerRecord` or a `registry_pb2.Resources`)."""

    @property
    def cpu_percent(self) -> float: ...

    @property
    def memory_percent(self) -> float: ...

    @property
    def gpu_memory_percent(self) -> float: ...

    @property
    def cpu_own_percent(self) -> float: ...

    @property
    def gpu_memory_own_percent(self) -> float: ...

    @property
    def cpu_platform_percent(self) -> float: ...


#: the resources the watermarks watch, as named in metrics labels
WATERMARK_RESOURCES = ("cpu", "memory", "gpu_memory")


@dataclass(frozen=True, slots=True)
class Level:
    """One watermark check: the reading it applies to (percent), the watermark, and how to say it."""

    resource: str  # one of WATERMARK_RESOURCES
    value: float
    watermark: float
    #: this worker's own share, left out of `value` (CPU and GPU memory)
    own: float = 0.0
    #: the platform's own other processes' share, left out of `value` too (CPU)
    platform: float = 0.0

    def describe(self, watermark: float | None = None) -> str:
        name = self.resource.replace("_", " ")
        shares = [f"this worker's {self.own:.1f}%"] if self.own > 0 else []
        if self.platform > 0:
            shares.append(f"the platform's {self.platform:.1f}%")
        besides = f" besides {' and '.join(shares)}" if shares else ""
        return f"{name} {self.value:.1f}%{besides} >= {self.watermark if watermark is None else watermark:.1f}%"


def watermark_levels(levels: ResourceLevels, settings: Settings) -> list[Level]:
    """The reading each watermark applies to. A worker's own work is not overload: CPU and GPU memory count
    without this worker's own share (its concurrency bounds that), and CPU without the platform's own other
    processes' either (other Sieve services and workers, Redis, PostgreSQL on the same host or in the same cgroup:
    the pipeline's own load must not pause the pipeline; the watermark guards against load the platform does
    not control); memory counts whole, since memory is not time-shared and the limit kills whoever fills it."""
    cpu_own = max(0.0, min(levels.cpu_own_percent, levels.cpu_percent))
    cpu_platform = max(0.0, min(levels.cpu_platform_percent, levels.cpu_percent - cpu_own))
    gpu_own = max(0.0, min(levels.gpu_memory_own_percent, levels.gpu_memory_percent))
    return [
        Level("cpu", levels.cpu_percent - cpu_own - cpu_platform, settings.cpu_watermark_pct, cpu_own, cpu_platform),
        Level("memory", levels.memory_percent, settings.memory_watermark_pct),
        Level("gpu_memory", levels.gpu_memory_percent - gpu_own, settings.gpu_memory_watermark_pct, gpu_own),
    ]


def availability(levels: ResourceLevels, settings: Settings) -> list[str]:
    """Why a worker with these readings cannot take work; an empty list means it is available.

    A reading at or above its watermark makes the worker unavailable (with the default 75 %: 75.0 % is
    unavailable, 74.9 % available); CPU and GPU memory are read without the worker's own share, CPU without the
    platform's either (`watermark_levels`). GPU memory reads 0 on a worker without a GPU, so its watermark never
    trips there. (The worker itself adds hysteresis: worker_svc.pressure.)
    """
    return [level.describe() for level in watermark_levels(levels, settings) if level.value >= level.watermark]


#: the task types a worker may take (every TaskType but UNSPECIFIED)
KNOWN_TASK_TYPES = frozenset(v for v in types_pb2.TaskType.values() if v != types_pb2.TASK_TYPE_UNSPECIFIED)
MAX_WORKER_ID_CHARS = 200


def worker_id_problem(worker_id: str) -> str | None:
    """What is wrong with a worker id (empty, longer than 200 characters, whitespace or control characters)."""
    if not worker_id.strip():
        return "must not be empty"
    if len(worker_id) > MAX_WORKER_ID_CHARS:
        return f"must be at most {MAX_WORKER_ID_CHARS} characters"
    if any(not ch.isprintable() or ch.isspace() for ch in worker_id):
        return "must not contain whitespace or control characters"
    return None


def task_type_value(name: str) -> int:
    """The value of a TaskType name: "OCR_IMAGE" or "TASK_TYPE_OCR_IMAGE" -> 2; ValueError if unknown."""
    name = name.strip().upper()
    full = name if name.startswith(_TASK_TYPE_PREFIX) else _TASK_TYPE_PREFIX + name
    return types_pb2.TaskType.Value(full)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def _resource_fields(resources: registry_pb2.Resources) -> dict[str, str]:
    """The hash fields holding a worker's readings."""
    return {
        "gpu_available": "1" if resources.gpu_available else "0",
        "gpu_count": str(resources.gpu_count),
        "gpu_names": json.dumps(list(resources.gpu_names), ensure_ascii=False),
        "gpu_memory_total_bytes": str(resources.gpu_memory_total_bytes),
        "gpu_util_percent": repr(float(resources.gpu_util_percent)),
        "gpu_memory_percent": repr(float(resources.gpu_memory_percent)),
        "cpu_count": str(resources.cpu_count),
        "cpu_percent": repr(float(resources.cpu_percent)),
        "memory_total_bytes": str(resources.memory_total_bytes),
        "memory_available_bytes": str(resources.memory_available_bytes),
        "memory_percent": repr(float(resources.memory_percent)),
        "active_tasks": str(resources.active_tasks),
        "cpu_own_percent": repr(float(resources.cpu_own_percent)),
        "cpu_platform_percent": repr(float(resources.cpu_platform_percent)),
        "gpu_memory_own_percent": repr(float(resources.gpu_memory_own_percent)),
        "scope": resources.scope,
    }


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One live worker as stored in Redis, with its availability under the watermarks."""

    worker_id: str
    hostname: str
    pid: int
    task_types: tuple[int, ...]
    gpu_available: bool
    gpu_count: int
    gpu_names: tuple[str, ...]
    gpu_memory_total_bytes: int
    gpu_util_percent: float
    gpu_memory_percent: float
    cpu_count: int
    cpu_percent: float
    memory_total_bytes: int
    memory_available_bytes: int
    memory_percent: float
    active_tasks: int
    registered_at: datetime
    last_heartbeat: datetime
    #: slots the worker registered (the most it may hold at once)
    concurrency: int = 0
    #: of cpu_percent / gpu_memory_percent, the worker's own share; where the readings come from
    cpu_own_percent: float = 0.0
    gpu_memory_own_percent: float = 0.0
    #: of cpu_percent, the platform's own other processes' share (0 in a record of a worker that predates it)
    cpu_platform_percent: float = 0.0
    scope: str = ""
    #: Filled by `WorkerRecords.list` from `availability`; empty means available.
    unavailable_reasons: tuple[str, ...] = field(default=())

    @property
    def available(self) -> bool:
        return not self.unavailable_reasons

    def takes(self, task_type: int) -> bool:
        return task_type in self.task_types

    @classmethod
    def from_hash(cls, worker_id: str, data: Mapping[str, str], settings: Settings) -> WorkerRecord:
        """Parses a worker hash (ValueError when a field is malformed); missing readings read as 0."""

        def num(name: str) -> float:
            return float(data.get(name) or 0)

        def count(name: str) -> int:
            return int(data.get(name) or 0)

        def moment(name: str) -> datetime:
            raw = data.get(name)
            return datetime.fromisoformat(raw).astimezone(UTC) if raw else datetime.fromtimestamp(0, UTC)

        task_types: list[int] = []
        for name in filter(None, (n.strip() for n in data.get("task_types", "").split(","))):
            try:
                task_types.append(task_type_value(name))
            except ValueError:
                log.warning(
                    "worker %s takes unknown task type %r; ignored", worker_id, name, extra={"worker_id": worker_id}
                )
        names = json.loads(data.get("gpu_names") or "[]")
        if not isinstance(names, list):
            raise ValueError(f"gpu_names is not a list: {names!r}")
        record = cls(
            worker_id=worker_id,
            hostname=data.get("hostname", ""),
            pid=count("pid"),
            task_types=tuple(task_types),
            gpu_available=data.get("gpu_available") == "1",
            gpu_count=count("gpu_count"),
            gpu_names=tuple(str(n) for n in names),
            gpu_memory_total_bytes=count("gpu_memory_total_bytes"),
            gpu_util_percent=num("gpu_util_percent"),
            gpu_memory_percent=num("gpu_memory_percent"),
            cpu_count=count("cpu_count"),
            cpu_percent=num("cpu_percent"),
            memory_total_bytes=count("memory_total_bytes"),
            memory_available_bytes=count("memory_available_bytes"),
            memory_percent=num("memory_percent"),
            active_tasks=count("active_tasks"),
            concurrency=count("concurrency"),
            cpu_own_percent=num("cpu_own_percent"),
            gpu_memory_own_percent=num("gpu_memory_own_percent"),
            cpu_platform_percent=num("cpu_platform_percent"),
            scope=data.get("scope", ""),
            registered_at=moment("registered_at"),
            last_heartbeat=moment("last_heartbeat"),
        )
        return _with_reasons(record, settings)

    def resources(self) -> registry_pb2.Resources:
        return registry_pb2.Resources(
            gpu_available=self.gpu_available,
            gpu_count=self.gpu_count,
            gpu_names=list(self.gpu_names),
            gpu_memory_total_bytes=self.gpu_memory_total_bytes,
            gpu_util_percent=self.gpu_util_percent,
            gpu_memory_percent=self.gpu_memory_percent,
            cpu_count=self.cpu_count,
            cpu_percent=self.cpu_percent,
            memory_total_bytes=self.memory_total_bytes,
            memory_available_bytes=self.memory_available_bytes,
            memory_percent=self.memory_percent,
            active_tasks=self.active_tasks,
            cpu_own_percent=self.cpu_own_percent,
            gpu_memory_own_percent=self.gpu_memory_own_percent,
            cpu_platform_percent=self.cpu_platform_percent,
            scope=self.scope,
        )

    def to_proto(self) -> registry_pb2.WorkerInfo:
        return registry_pb2.WorkerInfo(
            worker_id=self.worker_id,
            hostname=self.hostname,
            pid=self.pid,
            # the stubs type enum fields by their wrapper class; the values are the same ints
            task_types=cast("list[types_pb2.TaskType]", list(self.task_types)),
            resources=self.resources(),
            registered_at=_timestamp(self.registered_at),
            last_heartbeat=_timestamp(self.last_heartbeat),
            available=self.available,
            unavailable_reasons=list(self.unavailable_reasons),
            concurrency=self.concurrency,
        )


def _with_reasons(record: WorkerRecord, settings: Settings) -> WorkerRecord:
    return replace(record, unavailable_reasons=tuple(availability(record, settings)))


class WorkerRecords:
    """The registry's worker records in Redis (expects a client with `decode_responses=True`)."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings
        self._keys = Keys(settings.redis_prefix)
        self._record_prefix = self._keys.worker("")

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self._settings.worker_ttl_s * 1000))

    def _deadline_ms(self) -> int:
        return int(time.time() * 1000) + self._ttl_ms

    async def save(
        self,
        info: registry_pb2.WorkerInfo | registry_pb2.RegisterRequest,
        *,
        now: datetime | None = None,
    ) -> WorkerRecord:
        """Registers a worker: replaces its whole record (registered_at = last_heartbeat = now, unless a
        WorkerInfo brings its own registered_at) and starts its TTL, in one MULTI/EXEC. A concurrency of 0
        (not given) is stored as the fleet's maximum, SIEVE_MAX_WORKER_CONCURRENCY."""
        now = (now or datetime.now(UTC)).astimezone(UTC)
        registered_at = now
        if isinstance(info, registry_pb2.WorkerInfo) and info.HasField("registered_at"):
            registered_at = info.registered_at.ToDatetime(tzinfo=UTC)
        task_types = list(dict.fromkeys(info.task_types))
        mapping = {
            "hostname": info.hostname,
            "pid": str(info.pid),
            "task_types": ",".join(enum_name(types_pb2.TaskType, t) for t in task_types),
            "concurrency": str(
                min(info.concurrency or self._settings.max_worker_concurrency, self._settings.max_worker_concurrency)
            ),
            **_resource_fields(info.resources),
            "registered_at": _iso(registered_at),
            "last_heartbeat": _iso(now),
        }
        key = self._keys.worker(info.worker_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, self._ttl_ms)
            pipe.zadd(self._keys.worker_index, {info.worker_id: self._deadline_ms()})
            await pipe.execute()
        return WorkerRecord.from_hash(info.worker_id, mapping, self._settings)

    async def heartbeat(
        self,
        worker_id: str,
        resources: registry_pb2.Resources | None,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Refreshes a live worker's readings (when given), last_heartbeat and TTL.

        Returns False, writing nothing, when the record does not exist (never registered, or expired):
        the caller answers NOT_FOUND and the worker registers again. The existence check and the write
        are one optimistic transaction (WATCH/MULTI/EXEC): a record that expires or is removed in between
        aborts the write, so a heartbeat never resurrects a dead worker.
        """
        now = (now or datetime.now(UTC)).astimezone(UTC)
        key = self._keys.worker(worker_id)
        mapping = {"last_heartbeat": _iso(now)}
        if resources is not None:
            mapping.update(_resource_fields(resources))
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    # EXISTS as a plain command: a cluster pipeline's `exists` splits its keys by slot and, while
                    # WATCHing, drops the reply (it answers the pipeline itself, which is true)
                    if not await pipe.execute_command("EXISTS", key):
                        await pipe.unwatch()  # type: ignore[no-untyped-call]  # (redis-py leaves it unannotated)
                        return False
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(key, mapping=mapping)
                    pipe.pexpire(key, self._ttl_ms)
                    pipe.zadd(self._keys.worker_index, {worker_id: self._deadline_ms()})
                    await pipe.execute()
                    return True
                except WatchError:
                    # Changed (another heartbeat, a re-registration) or expired meanwhile: look again.
                    continue

    async def get(self, worker_id: str) -> WorkerRecord | None:
        """One live worker, or None."""
        data = await reply(self._redis.hgetall(self._keys.worker(worker_id)))
        return self._parse(worker_id, data) if data else None

    async def list(self, task_type: int | None = None, available_only: bool = False) -> list[WorkerRecord]:
        """Every live worker (optionally only those taking `task_type`, only available ones), by id.

        The ids come from the index (those whose deadline has not passed), never from a SCAN of the keyspace:
        with 100 000 devices' keys beside them, a SCAN would walk all of them to find a few workers. Each page
        of ids is read in one pipeline; a record that expired meanwhile reads empty and is left out.
        TASK_TYPE_UNSPECIFIED (0) or None means every type.
        """
        found: dict[str, WorkerRecord] = {}
        now_ms = int(time.time() * 1000)
        ids = await self._redis.zrangebyscore(self._keys.worker_index, now_ms, "+inf")
        for start in range(0, len(ids), PAGE_SIZE):
            await self._read_page([self._keys.worker(i) for i in ids[start : start + PAGE_SIZE]], found)
        records = sorted(found.values(), key=lambda r: r.worker_id)
        if task_type:
            records = [r for r in records if r.takes(task_type)]
        if available_only:
            records = [r for r in records if r.available]
        return records

    async def _read_page(self, keys: Sequence[str], found: dict[str, WorkerRecord]) -> None:
        """Reads the worker hashes of one page of keys not read yet (one pipeline) into `found`."""
        fresh = [k for k in dict.fromkeys(keys) if k.removeprefix(self._record_prefix) not in found]
        if not fresh:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in fresh:
                pipe.hgetall(key)
            hashes = await pipe.execute(raise_on_error=False)
        for key, data in zip(fresh, hashes, strict=True):
            worker_id = key.removeprefix(self._record_prefix)
            if isinstance(data, Exception):  # not a worker hash (WRONGTYPE): not ours to list
                log.warning("key %s is not a worker record: %s", key, data)
                continue
            record = self._parse(worker_id, data) if data else None
            if record is not None:
                found[worker_id] = record

    async def live_count(self) -> int:
        """How many workers are alive (records not yet expired), from the index, without scanning."""
        now_ms = int(time.time() * 1000)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(self._keys.worker_index, "-inf", now_ms)
            pipe.zcard(self._keys.worker_index)
            _, count = await pipe.execute()
        return int(count)

    async def remove(self, worker_id: str) -> bool:
        """Forgets a worker at once (graceful exit); True when it was registered."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.worker(worker_id))
            pipe.zrem(self._keys.worker_index, worker_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)

    def _parse(self, worker_id: str, data: Mapping[str, str]) -> WorkerRecord | None:
        try:
            return WorkerRecord.from_hash(worker_id, data, self._settings)
        except (ValueError, TypeError) as exc:
            log.warning("worker record %s is malformed (%s); left out", worker_id, exc, extra={"worker_id": worker_id})
            return None


__all__ = [
    "KNOWN_TASK_TYPES",
    "WATERMARK_RESOURCES",
    "Level",
    "ResourceLevels",
    "WorkerRecord",
    "WorkerRecords",
    "availability",
    "task_type_value",
    "watermark_levels",
    "worker_id_problem",
]
