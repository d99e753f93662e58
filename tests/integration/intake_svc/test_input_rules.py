"""The rules for what callers send, against real servers: strings PostgreSQL cannot store, bytes that are not
UTF-8 on the wire, oversized strings and lists in every service, and idempotency keys reused for another request.

Every refusal is a clean status naming the field (INVALID_ARGUMENT with a BadRequest detail, ALREADY_EXISTS with
an ErrorInfo) and changes nothing; every message quotes at most a short prefix of a bad value.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from intake_svc.idempotency import REASON
from intake_svc.server import build as build_intake
from sieve import rpc
from sieve.rpc.readiness import Stores
from sieve.v1 import (
    intake_pb2,
    registry_pb2,
    registry_pb2_grpc,
    scheduler_pb2,
    types_pb2,
)
from tests.integration.conftest import Platform, text_spec
from tests.integration.intake_svc.test_refusals import assert_nothing_recorded, refused_field

DEVICE = "AA-BB-CC-DD-EE-01"


def _wire(number: int, payload: bytes) -> bytes:
    """A length-delimited field (number, bytes) in protobuf wire format (lengths below 128)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


async def _raw_call(channel: grpc.aio.Channel, method: str, data: bytes) -> grpc.aio.AioRpcError:
    call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(data, timeout=10)
    return err.value


def _already_exists(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo detail")


# --- strings PostgreSQL cannot store, and oversized ones ----------------------------------------------
@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (text_spec(DEVICE, "a\x00b"), "task.text"),
        (text_spec(DEVICE, "\x00"), "task.text"),
        (text_spec(DEVICE, "fine", idempotency_key="k\x00"), "task.idempotency_key"),
        (text_spec(DEVICE, "fine", idempotency_key="k" * 201), "task.idempotency_key"),
        (
            intake_pb2.TaskSpec(
                device_id=DEVICE, type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url="https://example.com/a\x00.png"
            ),
            "task.image_url",
        ),
        (
            intake_pb2.TaskSpec(
                device_id=DEVICE, type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url="https://example.com/a\n.png"
            ),
            "task.image_url",
        ),
        (
            intake_pb2.TaskSpec(device_id=DEVICE, type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url="http://[::1"),
            "task.image_url",
        ),
        (text_spec("AA-BB-CC-DD-EE-01\x00", "fine"), "task.device_id"),
    ],
    ids=[
        "nul-in-text",
        "only-nul",
        "nul-in-key",
        "long-key",
        "nul-in-url",
        "newline-in-url",
        "unclosed-bracket-url",
        "nul-in-device",
    ],
)
async def test_a_string_postgresql_cannot_store_is_refused_naming_the_field(
    platform_without_workers: Platform, spec: intake_pb2.TaskSpec, field: str
) -> None:
    code, fields = await refused_field(platform_without_workers, spec)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, [field])
    await assert_nothing_recorded(platform_without_workers)


async def test_a_megabyte_device_id_is_refused_with_a_short_message(platform_without_workers: Platform) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform_without_workers.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("A" * 1_000_000, "x")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(err.value) == ["task.device_id"]
    assert len(err.value.details() or "") < 200
    await assert_nothing_recorded(platform_without_workers)


@pytest.mark.parametrize("task_id", ["-" * 1000 + "0" * 32, "{" + "0" * 32 + "}" + " " * 100, "x" * 100_000])
async def test_an_oversized_task_id_is_refused_with_a_short_message(
    platform_without_workers: Platform, task_id: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform_without_workers.intake.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(err.value) == ["task_id"]
    assert len(err.value.details() or "") < 200


@asynccontextmanager
async def raw_channel(platform: Platform, service: str) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a server of `service` ("intake", "scheduler", "registry") on the platform's Redis and
    PostgreSQL, for calls with hand-written request bytes (the platform keeps the intake's address to itself, so
    an intake of its own is started)."""
    settings = platform.settings
    server = None
    if service == "intake":
        app = await build_intake(settings, Stores.of(redis=platform.redis, pool=platform.pg))
        server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
        address = f"127.0.0.1:{server.port}"
    else:
        address = settings.scheduler_addr if service == "scheduler" else settings.registry_addr
    channel = rpc.channel(address, settings)
    try:
        yield channel
    finally:
        await channel.close()
        if server is not None:
            await server.stop(1)


# --- bytes that are not UTF-8 in string fields ----------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [b"a\xffb", b"\xed\xa0\x80", b"\xc0\x80", b"\xe4\xb8"],
    ids=["invalid-byte", "lone-surrogate", "overlong-nul", "truncated-sequence"],
)
async def test_invalid_utf8_in_a_text_is_invalid_argument_naming_the_field(
    platform_without_workers: Platform, raw: bytes
) -> None:
    spec = intake_pb2.TaskSpec(device_id=DEVICE, type=types_pb2.TASK_TYPE_TEXT).SerializeToString()
    async with raw_channel(platform_without_workers, "intake") as channel:
        error = await _raw_call(channel, "/sieve.v1.IntakeService/Submit", _wire(1, spec + _wire(4, raw)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(error) == ["task.text"]
    assert error.details() == "task.text: is not valid UTF-8"
    await assert_nothing_recorded(platform_without_workers)


async def test_invalid_utf8_in_a_batch_names_the_item(platform_without_workers: Platform) -> None:
    good = intake_pb2.TaskSpec(device_id=DEVICE, type=types_pb2.TASK_TYPE_TEXT, text="fine").SerializeToString()
    bad = intake_pb2.TaskSpec(type=types_pb2.TASK_TYPE_TEXT, text="fine").SerializeToString() + _wire(1, b"\xff")
    async with raw_channel(platform_without_workers, "intake") as channel:
        error = await _raw_call(
            channel, "/sieve.v1.IntakeService/SubmitBatch", _wire(1, good) + _wire(1, good) + _wire(1, bad)
        )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(error) == ["tasks[2].device_id"]
    await assert_nothing_recorded(platform_without_workers)


async def test_bytes_that_are_not_protobuf_are_invalid_argument(platform_without_workers: Platform) -> None:
    async with raw_channel(platform_without_workers, "intake") as channel:
        error = await _raw_call(channel, "/sieve.v1.IntakeService/GetTask", b"\xff\xff\xff")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(error) == ["request"]


async def test_a_pull_stream_whose_hello_is_not_utf8_ends_invalid_argument(platform_without_workers: Platform) -> None:
    hello = _wire(1, _wire(1, b"w\xff") + bytes([2 << 3, 1]))  # hello { worker_id: <bad>, task_types: [TEXT] }
    async with raw_channel(platform_without_workers, "scheduler") as channel:
        pull = channel.stream_stream(
            "/sieve.v1.SchedulerService/Pull", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )

        async def messages() -> AsyncIterator[bytes]:
            yield hello

        stream = pull(messages(), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stream:
                pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(err.value) == ["hello.worker_id"]


async def test_invalid_utf8_in_a_registration_names_the_field(platform_without_workers: Platform) -> None:
    request = registry_pb2.RegisterRequest(worker_id="w1", task_types=[types_pb2.TASK_TYPE_TEXT]).SerializeToString()
    async with raw_channel(platform_without_workers, "registry") as channel:
        error = await _raw_call(
            channel, "/sieve.v1.RegistryService/Register", request + _wire(5, _wire(3, b"GPU \xff"))
        )
    assert rpc.bad_fields_of(error) == ["resources.gpu_names[0]"]


# --- idempotency keys ------------------------------------------------------------------------------------
async def test_a_key_reused_with_the_same_request_answers_the_first_task(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    spec = text_spec(DEVICE, "same job", idempotency_key="job-1", priority=types_pb2.PRIORITY_HIGH)
    first = await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    again = await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    assert (again.task.task_id, again.deduplicated, first.deduplicated) == (first.task.task_id, True, False)
    assert await p.queues.pending() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"text": "another job"},
        {"priority": types_pb2.PRIORITY_LOW},
        {"ttl_s": 60},
        {"image": True},
    ],
    ids=["text", "priority", "ttl", "type-and-payload"],
)
async def test_a_key_reused_with_another_request_is_already_exists_naming_the_first_task(
    platform_without_workers: Platform, change: dict[str, object]
) -> None:
    p = platform_without_workers
    first = await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, "the job", idempotency_key="k")))
    other = text_spec(DEVICE, str(change.get("text", "the job")), idempotency_key="k")
    if "priority" in change:
        other.priority = int(change["priority"])  # type: ignore[call-overload]
    if "ttl_s" in change:
        other.ttl.seconds = int(change["ttl_s"])  # type: ignore[call-overload]
    if "image" in change:
        other = intake_pb2.TaskSpec(
            device_id=DEVICE,
            type=types_pb2.TASK_TYPE_OCR_IMAGE,
            idempotency_key="k",
            image_url="https://example.com/a.png",
        )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await p.intake.Submit(intake_pb2.SubmitRequest(task=other))
    info = _already_exists(err.value)
    assert (info.reason, info.metadata["task_id"], info.metadata["field"]) == (
        REASON,
        first.task.task_id,
        "task.idempotency_key",
    )
    assert first.task.task_id in (err.value.details() or "")
    # nothing changed: one row, one queue entry, the first task as it was
    assert await p.pg.fetchval("SELECT count(*) FROM tasks") == 1
    assert await p.queues.pending() == 1
    task = (await p.intake.GetTask(intake_pb2.GetTaskRequest(task_id=first.task.task_id))).task
    assert (task.status, task.priority) == (types_pb2.TASK_STATUS_PENDING, types_pb2.PRIORITY_NORMAL)


async def test_a_key_is_scoped_to_its_device(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    a = await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, "one", idempotency_key="k")))
    b = await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-02", "two", idempotency_key="k")))
    assert a.task.task_id != b.task.task_id and not b.deduplicated


async def test_in_a_batch_a_reused_key_refuses_only_its_item(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    first = await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, "the job", idempotency_key="k")))
    reply = await p.intake.SubmitBatch(
        intake_pb2.SubmitBatchRequest(
            tasks=[
                text_spec(DEVICE, "new"),
                text_spec(DEVICE, "not the job", idempotency_key="k"),
                text_spec(DEVICE, "the job", idempotency_key="k"),
                text_spec(DEVICE, "twice", idempotency_key="k2"),
                text_spec(DEVICE, "twice, other", idempotency_key="k2"),
            ]
        )
    )
    new, reused, same, first_of_two, second_of_two = reply.items
    assert new.code == 0 and new.task.task_id and not new.deduplicated
    assert reused.code == grpc.StatusCode.ALREADY_EXISTS.value[0] and not reused.HasField("task")
    assert first.task.task_id in reused.message
    assert same.code == 0 and same.deduplicated and same.task.task_id == first.task.task_id
    assert first_of_two.code == 0 and not first_of_two.deduplicated
    assert second_of_two.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert first_of_two.task.task_id in second_of_two.message
    assert await p.pg.fetchval("SELECT count(*) FROM tasks") == 3
    assert await p.queues.pending() == 3


async def test_a_task_without_a_key_stores_no_fingerprint(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, "no key")))
    await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, "key", idempotency_key="k")))
    rows = await p.pg.fetch("SELECT idempotency_key, fingerprint FROM tasks ORDER BY idempotency_key NULLS FIRST")
    assert rows[0]["fingerprint"] is None
    assert len(rows[1]["fingerprint"]) == 32


# --- registry ---------------------------------------------------------------------------------------------
def _registration(**changes: object) -> registry_pb2.RegisterRequest:
    request = registry_pb2.RegisterRequest(
        worker_id="w1",
        hostname="host-1",
        task_types=[types_pb2.TASK_TYPE_TEXT],
        resources=registry_pb2.Resources(cpu_count=4, cpu_percent=10),
    )
    for name, value in changes.items():
        if name == "gpu_names":
            request.resources.gpu_names.extend(value)  # type: ignore[arg-type]
        elif name in registry_pb2.Resources.DESCRIPTOR.fields_by_name:
            setattr(request.resources, name, value)
        elif name == "task_types":
            del request.task_types[:]
            request.task_types.extend(value)  # type: ignore[arg-type]
        else:
            setattr(request, name, value)
    return request


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hostname": "host\x00"}, "hostname"),
        ({"hostname": "h" * 256}, "hostname"),
        ({"gpu_names": ["GPU"] * 65}, "resources.gpu_names"),
        ({"gpu_names": ["ok", "bad\nname"]}, "resources.gpu_names[1]"),
        ({"gpu_names": ["g" * 257]}, "resources.gpu_names[0]"),
        ({"task_types": [types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_TEXT]}, "task_types"),
        ({"task_types": [types_pb2.TASK_TYPE_TEXT] * 17}, "task_types"),
        ({"cpu_count": 2**32 - 1}, "resources.cpu_count"),
        ({"memory_total_bytes": 2**64 - 1}, "resources.memory_total_bytes"),
        ({"gpu_count": 100_000}, "resources.gpu_count"),
        ({"cpu_percent": float("nan")}, "resources.cpu_percent"),
        ({"gpu_util_percent": float("inf")}, "resources.gpu_util_percent"),
    ],
    ids=[
        "nul-hostname",
        "long-hostname",
        "many-gpus",
        "gpu-name-newline",
        "long-gpu-name",
        "repeated-type",
        "many-types",
        "huge-cpu-count",
        "huge-memory",
        "huge-gpu-count",
        "nan-cpu",
        "inf-gpu",
    ],
)
async def test_a_registration_over_a_limit_is_refused_naming_the_field(
    platform_without_workers: Platform, changes: dict[str, object], field: str
) -> None:
    async with raw_channel(platform_without_workers, "registry") as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Register(_registration(**changes))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert rpc.bad_fields_of(err.value) == [field]
        assert (await stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers == []


async def test_a_plausible_registration_is_accepted(platform_without_workers: Platform) -> None:
    async with raw_channel(platform_without_workers, "registry") as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        await stub.Register(
            _registration(
                gpu_names=["NVIDIA H200"],
                gpu_count=1,
                memory_total_bytes=2**40,
                task_types=[types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE],
            )
        )
        workers = (await stub.ListWorkers(registry_pb2.ListWorkersRequest())).workers
    assert [w.worker_id for w in workers] == ["w1"]


# --- dead-letter filters ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flt", "field"),
    [
        (scheduler_pb2.DeadLetterFilter(error_contains="e" * 1001), "filter.error_contains"),
        (scheduler_pb2.DeadLetterFilter(error_contains="a\x00"), "filter.error_contains"),
        (scheduler_pb2.DeadLetterFilter(task_id="-" * 10_000 + "0" * 32), "filter.task_id"),
        (scheduler_pb2.DeadLetterFilter(device_id=" " * 10_000 + "AABBCCDDEEFF"), "filter.device_id"),
    ],
    ids=["long-error", "nul-error", "long-task-id", "long-device"],
)
async def test_a_dead_letter_filter_over_a_limit_is_refused_naming_the_field(
    platform_without_workers: Platform, flt: scheduler_pb2.DeadLetterFilter, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform_without_workers.scheduler_stub.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest(filter=flt))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(err.value) == [field]
    assert len(err.value.details() or "") < 200


async def test_a_dead_letter_filter_matches_any_spelling_of_a_task_id(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    task_id = "0190a4d2-6c3e-7000-8000-000000000001"
    await p.redis.lpush(
        p.queues.keys.dead_letters,
        json.dumps({"task_id": task_id, "device": "AA:BB:CC:DD:EE:01", "task_type": 1, "priority": 3, "error": "boom"}),
    )
    for spelling in (task_id.upper(), "{" + task_id + "}", "urn:uuid:" + task_id, task_id.replace("-", "")):
        reply = await p.scheduler_stub.ListDeadLetters(
            scheduler_pb2.ListDeadLettersRequest(filter=scheduler_pb2.DeadLetterFilter(task_id=spelling))
        )
        assert [d.task_id for d in reply.dead_letters] == [task_id], spelling


# --- size limits of the transport -----------------------------------------------------------------------------
async def test_a_request_over_the_message_limit_is_resource_exhausted(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    big = "x" * (p.settings.grpc_max_message_bytes + 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, big))), 30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await assert_nothing_recorded(p)
