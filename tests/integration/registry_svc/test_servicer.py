"""Integration tests of the registry service over gRPC against the real Redis: Register, Heartbeat,
ListWorkers, validation, expiry, SCAN listing, and the worker's RegistryClient re-registering."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from redis.asyncio import Redis

import sieve.redis.worker_records
from registry_svc.server import build
from sieve.redis.keys import Keys
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc import RunningServer, bad_fields_of, create_server
from sieve.rpc import channel as open_channel
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc, types_pb2
from tests.support.redis import prefix_keys
from worker_svc.registration import RegistryClient
from worker_svc.resources import ResourceSampler

TEXT = types_pb2.TASK_TYPE_TEXT
OCR = types_pb2.TASK_TYPE_OCR_IMAGE


@dataclass
class Registry:
    running: RunningServer
    stub: registry_pb2_grpc.RegistryServiceStub

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.running.port}"


@contextlib.asynccontextmanager
async def _serving(settings: Settings, redis: Redis, address: str = "127.0.0.1:0") -> AsyncIterator[Registry]:
    app = await build(settings, Stores.of(redis=redis))
    running = await create_server(app.service, address, settings)
    channel = open_channel(f"127.0.0.1:{running.port}", settings)
    try:
        yield Registry(running, registry_pb2_grpc.RegistryServiceStub(channel))
    finally:
        await channel.close()
        await running.stop(1)


@pytest.fixture
async def registry(settings: Settings, redis: Redis) -> AsyncIterator[Registry]:
    # the registry judges readings against the default watermarks (75 %)
    async with _serving(settings, redis) as served:
        yield served


def _resources(cpu: float = 10.0, memory: float = 20.0, gpu_memory: float = 0.0) -> registry_pb2.Resources:
    return registry_pb2.Resources(
        cpu_count=16,
        cpu_percent=cpu,
        memory_total_bytes=33559728128,
        memory_available_bytes=12559728128,
        memory_percent=memory,
        gpu_memory_percent=gpu_memory,
        active_tasks=1,
    )


def _register(worker_id: str, *task_types: int, **readings: float) -> registry_pb2.RegisterRequest:
    return registry_pb2.RegisterRequest(
        worker_id=worker_id,
        hostname="worker-01",
        pid=12345,
        task_types=list(task_types or (TEXT,)),
        resources=_resources(**readings),
    )


def _heartbeat(worker_id: str, **readings: float) -> registry_pb2.HeartbeatRequest:
    return registry_pb2.HeartbeatRequest(worker_id=worker_id, resources=_resources(**readings))


async def _list(registry: Registry, task_type: int = 0, available_only: bool = False) -> list[str]:
    answer = await registry.stub.ListWorkers(
        registry_pb2.ListWorkersRequest(task_type=task_type, available_only=available_only)
    )
    return [w.worker_id for w in answer.workers]


async def _keys_of_this_test(redis: Redis, settings: Settings) -> list[str]:
    """Keys the registry wrote (the generation key is set by the fixture, as a scheduler would)."""
    generation = Keys(settings.redis_prefix).generation
    return [k for k in await prefix_keys(redis, settings.redis_prefix) if k != generation]


async def _has_heartbeat(client: RegistryClient) -> bool:
    return client.available is not None


async def _listed(registry: Registry, worker_id: str) -> bool:
    return worker_id in await _list(registry)


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


# --- register and list ----------------------------------------------------------------------------
async def test_a_registered_worker_is_listed_with_its_readings_and_available(registry: Registry) -> None:
    # Given a worker registered with modest readings
    before = datetime.now(UTC) - timedelta(seconds=1)
    answer = await registry.stub.Register(_register("w1", TEXT, OCR, cpu=35.0, memory=62.5))

    # When the workers are listed
    listed = await registry.stub.ListWorkers(registry_pb2.ListWorkersRequest())

    # Then the registry told it the heartbeat period and TTL, and lists it with its readings, available
    assert (answer.heartbeat_interval_s, answer.worker_ttl_s) == (15, 60)
    [worker] = listed.workers
    assert worker.worker_id == "w1"
    assert (worker.hostname, worker.pid) == ("worker-01", 12345)
    assert list(worker.task_types) == [TEXT, OCR]
    assert worker.resources.cpu_percent == 35.0
    assert worker.resources.memory_percent == 62.5
    assert worker.resources.cpu_count == 16
    assert worker.resources.memory_total_bytes == 33559728128
    assert worker.resources.active_tasks == 1
    assert worker.available
    assert list(worker.unavailable_reasons) == []
    assert worker.registered_at.ToDatetime(tzinfo=UTC) >= before
    assert worker.last_heartbeat.ToDatetime(tzinfo=UTC) >= before


async def test_a_worker_is_stored_as_one_hash_with_a_ttl(registry: Registry, redis: Redis, settings: Settings) -> None:
    # Given a registered worker
    await registry.stub.Register(_register("w1", TEXT, OCR, cpu=35.0))

    # Then its record is one hash, in the shape sieve.redis.worker_records documents, that expires within the
    # worker TTL
    key = Keys(settings.redis_prefix).worker("w1")
    stored = await redis.hgetall(key)
    assert stored["task_types"] == "TEXT,OCR_IMAGE"
    assert stored["gpu_available"] == "0"
    assert float(stored["cpu_percent"]) == 35.0
    assert datetime.fromisoformat(stored["last_heartbeat"]).utcoffset() == timedelta(0)
    assert 0 < await redis.pttl(key) <= settings.worker_ttl_s * 1000


async def test_a_worker_at_90_percent_memory_is_listed_unavailable_with_the_reason(
    registry: Registry,
) -> None:
    # Given a worker whose memory is 90 % used
    await registry.stub.Register(_register("busy", memory=90.0))

    # When the workers are listed
    [worker] = (await registry.stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers

    # Then it is unavailable because of its memory
    assert not worker.available
    assert list(worker.unavailable_reasons) == ["memory 90.0% >= 75.0%"]


async def test_listing_filters_by_task_type_and_by_availability(registry: Registry) -> None:
    # Given a text worker, an OCR+text worker, and an OCR worker over the GPU-memory watermark
    await registry.stub.Register(_register("w-text", TEXT))
    await registry.stub.Register(_register("w-ocr", OCR, TEXT))
    await registry.stub.Register(_register("w-busy", OCR, gpu_memory=80.0))

    # Then each filter, and both together, select the right workers
    assert await _list(registry) == ["w-busy", "w-ocr", "w-text"]
    assert await _list(registry, task_type=OCR) == ["w-busy", "w-ocr"]
    assert await _list(registry, task_type=TEXT) == ["w-ocr", "w-text"]
    assert await _list(registry, available_only=True) == ["w-ocr", "w-text"]
    assert await _list(registry, task_type=OCR, available_only=True) == ["w-ocr"]


async def test_registering_again_replaces_the_record(registry: Registry) -> None:
    # Given a worker registered for OCR over the CPU watermark
    await registry.stub.Register(_register("w1", OCR, cpu=95.0))

    # When it registers again for text only, with a calm CPU
    await registry.stub.Register(_register("w1", TEXT, cpu=5.0))

    # Then only the new registration is listed
    [worker] = (await registry.stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers
    assert list(worker.task_types) == [TEXT]
    assert worker.available


async def test_listing_reads_the_index_in_pages_and_lists_all_300_workers_without_walking_the_keyspace(
    registry: Registry, redis: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 300 registered workers, small pages, and a Redis client on which KEYS and SCAN would fail (the keyspace
    # holds every device's keys too: walking it to find a few workers costs Redis time in proportion to all of them)
    await asyncio.gather(*(registry.stub.Register(_register(f"w{i:03d}")) for i in range(300)))
    monkeypatch.setattr(sieve.redis.worker_records, "PAGE_SIZE", 50)

    async def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("KEYS and SCAN must not be used")

    for walk in ("keys", "scan", "scan_iter"):
        monkeypatch.setattr(redis, walk, no_walk)

    # When the workers are listed
    listed = await _list(registry)

    # Then every one of them is listed once, and the live count agrees
    assert listed == [f"w{i:03d}" for i in range(300)]
    assert await WorkerRecords(redis, settings).live_count() == 300


# --- heartbeat ------------------------------------------------------------------------------------
async def test_a_heartbeat_refreshes_the_readings_and_answers_availability(registry: Registry) -> None:
    # Given a registered worker
    await registry.stub.Register(_register("w1", cpu=10.0))
    [first] = (await registry.stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers

    # When it heartbeats with CPU over the watermark
    answer = await registry.stub.Heartbeat(_heartbeat("w1", cpu=92.0))

    # Then it is told it is unavailable, and the listing shows the fresh readings
    assert not answer.available
    [worker] = (await registry.stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers
    assert worker.resources.cpu_percent == 92.0
    assert list(worker.unavailable_reasons) == ["cpu 92.0% >= 75.0%"]
    assert worker.last_heartbeat.ToDatetime() >= first.last_heartbeat.ToDatetime()
    assert worker.registered_at == first.registered_at


async def test_a_heartbeat_of_an_unknown_worker_is_not_found_and_writes_nothing(
    registry: Registry, redis: Redis, settings: Settings
) -> None:
    # When a worker that never registered heartbeats
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await registry.stub.Heartbeat(_heartbeat("ghost"))

    # Then it is told NOT_FOUND, and no record appears
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert await _keys_of_this_test(redis, settings) == []


async def test_heartbeats_keep_a_worker_alive_past_its_ttl(settings: Settings, redis: Redis) -> None:
    # Given a registry with a one-second worker TTL and a registered worker
    async with _serving(settings.replace(worker_ttl_s=1.0), redis) as registry:
        await registry.stub.Register(_register("w1"))

        # When it heartbeats every 0.3 s for 1.8 s
        for _ in range(6):
            await asyncio.sleep(0.3)
            await registry.stub.Heartbeat(_heartbeat("w1"))

        # Then it is still listed
        assert await _list(registry) == ["w1"]


async def test_a_silent_worker_expires_after_the_ttl_and_its_heartbeat_is_then_not_found(
    settings: Settings, redis: Redis
) -> None:
    # Given a registry with a one-second worker TTL and a registered worker
    short = settings.replace(worker_ttl_s=1.0)
    async with _serving(short, redis) as registry:
        await registry.stub.Register(_register("w1"))
        assert await WorkerRecords(redis, short).live_count() == 1

        # When the worker stays silent longer than the TTL
        await asyncio.sleep(1.5)

        # Then it is no longer listed or counted, and its next heartbeat is NOT_FOUND without reviving it
        assert await _list(registry) == []
        assert await WorkerRecords(redis, short).live_count() == 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await registry.stub.Heartbeat(_heartbeat("w1"))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert not await redis.exists(Keys(short.redis_prefix).worker("w1"))


async def test_the_registry_client_registers_again_on_its_own_after_its_record_expired(
    settings: Settings, redis: Redis
) -> None:
    # Given a registry with a one-second TTL and a worker heartbeating every 0.2 s through RegistryClient
    short = settings.replace(
        worker_ttl_s=1.0,
        heartbeat_interval_s=0.2,
        worker_id="w-client",
        fixed_resources="cpu=10,memory=20",
        test_hooks=True,
    )
    records = WorkerRecords(redis, short)
    stop = asyncio.Event()
    async with _serving(short, redis) as first:
        port = first.running.port
        client = RegistryClient(short.replace(registry_addr=first.address), ResourceSampler(short), [TEXT], lambda: 3)
        running = asyncio.create_task(client.run(stop))
        await _eventually(lambda: _has_heartbeat(client))
        assert [r.worker_id for r in await records.list()] == ["w-client"]

    try:
        # When the registry is down for longer than the TTL, so that the record expires
        await asyncio.sleep(1.5)
        assert await records.list() == []
        assert not running.done()  # the client keeps retrying instead of crashing

        # And the registry comes back on the same address
        async with _serving(short, redis, f"127.0.0.1:{port}") as second:
            # Then the client's heartbeat is NOT_FOUND and it registers again by itself
            await _eventually(lambda: _listed(second, "w-client"), timeout_s=15.0)
            assert client.registrations == 2
            [worker] = (await second.stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers
            assert worker.resources.cpu_percent == 10.0
            assert worker.resources.active_tasks == 3
            assert client.last_resources is not None
            assert client.last_resources.memory_percent == 20.0
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=5)


async def test_the_registry_client_stops_promptly_when_asked(settings: Settings, redis: Redis) -> None:
    # Given a RegistryClient heartbeating every 15 s against a registry
    async with _serving(settings, redis) as registry:
        client = RegistryClient(
            settings.replace(registry_addr=registry.address, worker_id="w1"),
            ResourceSampler(settings),
            [TEXT],
            lambda: 0,
        )
        stop = asyncio.Event()
        running = asyncio.create_task(client.run(stop))
        await _eventually(lambda: _listed(registry, "w1"))

        # When it is told to stop
        stop.set()

        # Then it ends at once, not after its heartbeat period
        await asyncio.wait_for(running, timeout=2)


# --- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (registry_pb2.RegisterRequest(worker_id="", task_types=[TEXT]), "worker_id"),
        (registry_pb2.RegisterRequest(worker_id="   ", task_types=[TEXT]), "worker_id"),
        (registry_pb2.RegisterRequest(worker_id="w" * 201, task_types=[TEXT]), "worker_id"),
        (registry_pb2.RegisterRequest(worker_id="w\n1", task_types=[TEXT]), "worker_id"),
        (registry_pb2.RegisterRequest(worker_id="w1"), "task_types"),
        (registry_pb2.RegisterRequest(worker_id="w1", task_types=[TEXT, 99]), "task_types"),
        (registry_pb2.RegisterRequest(worker_id="w1", task_types=[types_pb2.TASK_TYPE_UNSPECIFIED]), "task_types"),
        (
            registry_pb2.RegisterRequest(worker_id="w1", task_types=[TEXT], resources=_resources(cpu=120.0)),
            "resources.cpu_percent",
        ),
        (
            registry_pb2.RegisterRequest(worker_id="w1", task_types=[TEXT], resources=_resources(memory=-1.0)),
            "resources.memory_percent",
        ),
    ],
    ids=[
        "empty-id",
        "blank-id",
        "long-id",
        "control-char-id",
        "no-types",
        "unknown-type",
        "unspecified-type",
        "cpu-over-100",
        "negative-memory",
    ],
)
async def test_a_bad_registration_is_invalid_argument_naming_the_field_and_writes_nothing(
    registry: Registry, redis: Redis, settings: Settings, request_: registry_pb2.RegisterRequest, field: str
) -> None:
    # When a worker registers with a bad field
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await registry.stub.Register(request_)

    # Then it is refused naming that field, and nothing is written to Redis
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_fields_of(refused.value) == [field]
    assert await _keys_of_this_test(redis, settings) == []


async def test_a_worker_id_of_200_characters_is_accepted(registry: Registry) -> None:
    await registry.stub.Register(_register("w" * 200))

    assert await _list(registry) == ["w" * 200]


async def test_a_heartbeat_without_a_worker_id_is_invalid_argument(registry: Registry) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await registry.stub.Heartbeat(registry_pb2.HeartbeatRequest(worker_id="", resources=_resources()))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_fields_of(refused.value) == ["worker_id"]


async def test_listing_an_unknown_task_type_is_invalid_argument(registry: Registry) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await registry.stub.ListWorkers(registry_pb2.ListWorkersRequest(task_type=42))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_fields_of(refused.value) == ["task_type"]


# --- records --------------------------------------------------------------------------------------
async def test_a_removed_worker_is_gone_at_once(registry: Registry, redis: Redis, settings: Settings) -> None:
    # Given a registered worker
    await registry.stub.Register(_register("w1"))
    records = WorkerRecords(redis, settings)

    # When it is removed on a graceful exit
    assert await records.remove("w1")

    # Then it is neither listed nor counted, and its heartbeat is NOT_FOUND
    assert await records.list() == []
    assert await records.live_count() == 0
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await registry.stub.Heartbeat(registry_pb2.HeartbeatRequest(worker_id="w1"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
