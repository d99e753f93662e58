"""The registry's RPCs: validate the request, then read or write the worker records of `sieve.redis.worker_records`.

Register replaces a worker's record and starts its TTL; Heartbeat refreshes a live record and answers
NOT_FOUND for one that expired (the worker then registers again); ListWorkers lists live records with
their availability under the watermarks. A bad request gets INVALID_ARGUMENT naming the field and writes
nothing; a Redis failure gets UNAVAILABLE, which workers retry.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.rpc import status_pb2
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sieve.fields import text_problem
from sieve.redis.worker_records import KNOWN_TASK_TYPES, WorkerRecords, availability, worker_id_problem
from sieve.rpc import abort, invalid_argument, plain_status
from sieve.rpc.auth import current_principal
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc, types_pb2

log = logging.getLogger("sieve.registry")

MAX_HOSTNAME_CHARS = 255
MAX_TASK_TYPES = 16
MAX_GPU_NAMES = 64
MAX_GPU_NAME_CHARS = 256
MAX_SCOPE_CHARS = 200
_PERCENT_FIELDS = (
    "cpu_percent",
    "memory_percent",
    "gpu_memory_percent",
    "gpu_util_percent",
    "cpu_own_percent",
    "gpu_memory_own_percent",
    "cpu_platform_percent",
)
#: the largest plausible value of each count and size a worker reports (anything above is a broken sampler)
_LIMITS = {
    "gpu_count": 1024,
    "cpu_count": 1 << 20,
    "active_tasks": 1 << 20,
    "gpu_memory_total_bytes": 1 << 60,
    "memory_total_bytes": 1 << 60,
    "memory_available_bytes": 1 << 60,
}

T = TypeVar("T")


def _worker_id_problem(worker_id: str) -> status_pb2.Status | None:
    """The worker id rules the scheduler applies to a hello too (`worker_records.worker_id_problem`)."""
    problem = worker_id_problem(worker_id)
    return None if problem is None else invalid_argument("worker_id", problem)


def _resources_problem(resources: registry_pb2.Resources) -> status_pb2.Status | None:
    """Percentages finite and from 0 to 100, counts and sizes under their limits, names and scope short and
    printable (every field lands in the worker's Redis record and in ListWorkers)."""
    for name in _PERCENT_FIELDS:
        value = getattr(resources, name)
        if not math.isfinite(value) or not 0 <= value <= 100:
            return invalid_argument(f"resources.{name}", f"{value} is not a percentage from 0 to 100")
    for name, limit in _LIMITS.items():
        if getattr(resources, name) > limit:
            return invalid_argument(f"resources.{name}", f"must be at most {limit}")
    if len(resources.gpu_names) > MAX_GPU_NAMES:
        return invalid_argument("resources.gpu_names", f"must have at most {MAX_GPU_NAMES} entries")
    for i, gpu_name in enumerate(resources.gpu_names):
        problem = text_problem(gpu_name, max_chars=MAX_GPU_NAME_CHARS, printable=True)
        if problem is not None:
            return invalid_argument(f"resources.gpu_names[{i}]", problem)
    problem = text_problem(resources.scope, max_chars=MAX_SCOPE_CHARS, printable=True)
    if problem is not None:
        return invalid_argument("resources.scope", problem)
    return None


def _task_types_problem(task_types: Sequence[int]) -> status_pb2.Status | None:
    if not task_types:
        return invalid_argument("task_types", "must name at least one task type")
    if len(task_types) > MAX_TASK_TYPES:
        return invalid_argument("task_types", f"must have at most {MAX_TASK_TYPES} entries")
    seen: set[int] = set()
    for i, task_type in enumerate(task_types):
        if task_type not in KNOWN_TASK_TYPES:
            return invalid_argument("task_types", f"[{i}]: {task_type} is not a known task type")
        if task_type in seen:
            return invalid_argument("task_types", f"[{i}]: repeats {types_pb2.TaskType.Name(task_type)}")
        seen.add(task_type)
    return None


def register_problem(request: registry_pb2.RegisterRequest, max_concurrency: int) -> status_pb2.Status | None:
    """What is wrong with a RegisterRequest (the first problem found), or None."""
    problem = _worker_id_problem(request.worker_id)
    if problem is not None:
        return problem
    if request.concurrency > max_concurrency:
        return invalid_argument("concurrency", f"must be at most {max_concurrency} (SIEVE_MAX_WORKER_CONCURRENCY)")
    hostname_problem = text_problem(request.hostname, max_chars=MAX_HOSTNAME_CHARS, printable=True)
    if hostname_problem is not None:
        return invalid_argument("hostname", hostname_problem)
    return _task_types_problem(request.task_types) or _resources_problem(request.resources)


def heartbeat_problem(request: registry_pb2.HeartbeatRequest) -> status_pb2.Status | None:
    """What is wrong with a HeartbeatRequest, or None."""
    return _worker_id_problem(request.worker_id) or _resources_problem(request.resources)


class RegistryServicer(registry_pb2_grpc.RegistryServiceServicer):
    """Register, Heartbeat and ListWorkers over the worker records in Redis."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        self._settings = settings
        self.records = WorkerRecords(redis, settings)

    async def _store(self, context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]) -> T:
        """Runs a Redis call; a Redis outage ends the RPC with UNAVAILABLE (the worker retries)."""
        try:
            return await call()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            log.warning("worker store unavailable: %s", exc)
            await abort(context, plain_status(grpc.StatusCode.UNAVAILABLE, "worker store unavailable"))
            raise  # not reached: abort raises

    async def _as_worker(self, context: grpc.aio.ServicerContext[Any, Any], worker_id: str) -> None:
        """A worker credential speaks only for the worker ids it names (see `Principal.may_act_as_worker`)."""
        principal = current_principal.get()
        if not principal.may_act_as_worker(worker_id):
            await abort(
                context,
                plain_status(
                    grpc.StatusCode.PERMISSION_DENIED, f"credential {principal.name!r} may not act as this worker id"
                ),
            )

    async def Register(
        self, request: registry_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> registry_pb2.RegisterResponse:
        problem = register_problem(request, self._settings.max_worker_concurrency)
        if problem is not None:
            await abort(context, problem)
        await self._as_worker(context, request.worker_id)
        record = await self._store(context, lambda: self.records.save(request))
        log.info(
            "worker %s registered (%s)",
            request.worker_id,
            "available" if record.available else "; ".join(record.unavailable_reasons),
            extra={"worker_id": request.worker_id},
        )
        return registry_pb2.RegisterResponse(
            heartbeat_interval_s=max(1, int(self._settings.heartbeat_interval_s)),
            worker_ttl_s=max(1, math.ceil(self._settings.worker_ttl_s)),
        )

    async def Heartbeat(
        self, request: registry_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> registry_pb2.HeartbeatResponse:
        problem = heartbeat_problem(request)
        if problem is not None:
            await abort(context, problem)
        await self._as_worker(context, request.worker_id)
        resources = request.resources if request.HasField("resources") else None
        alive = await self._store(context, lambda: self.records.heartbeat(request.worker_id, resources))
        if not alive:
            await abort(
                context,
                plain_status(
                    grpc.StatusCode.NOT_FOUND,
                    f"worker {request.worker_id!r} is not registered (or its record expired); register again",
                ),
            )
        if resources is None:
            record = await self._store(context, lambda: self.records.get(request.worker_id))
            return registry_pb2.HeartbeatResponse(available=record is not None and record.available)
        return registry_pb2.HeartbeatResponse(available=not availability(resources, self._settings))

    async def ListWorkers(
        self, request: registry_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> registry_pb2.ListWorkersResponse:
        task_type = request.task_type
        if task_type != types_pb2.TASK_TYPE_UNSPECIFIED and task_type not in KNOWN_TASK_TYPES:
            await abort(context, invalid_argument("task_type", f"{task_type} is not a known task type"))
        records = await self._store(
            context, lambda: self.records.list(request.task_type or None, request.available_only)
        )
        return registry_pb2.ListWorkersResponse(workers=[r.to_proto() for r in records])


__all__ = ["RegistryServicer", "heartbeat_problem", "register_problem"]
