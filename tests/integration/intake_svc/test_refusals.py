"""Bad input gets INVALID_ARGUMENT naming the field and changes nothing; callers without a token are
UNAUTHENTICATED; full queues answer RESOURCE_EXHAUSTED with RetryInfo and refuse only the full device."""

from __future__ import annotations

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from intake_svc.server import build as build_intake
from sieve import rpc
from sieve.redis.keys import Keys
from sieve.rpc.auth import hash_token
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.integration.conftest import PNG, Platform, text_spec
from tests.support.redis import keys_matching


async def assert_nothing_recorded(platform: Platform) -> None:
    assert await platform.pg.fetchval("SELECT count(*) FROM tasks") == 0
    assert await platform.queues.pending() == 0
    assert await keys_matching(platform.redis, platform.queues.keys.queue_pattern) == []


async def refused_field(platform: Platform, spec: intake_pb2.TaskSpec) -> tuple[grpc.StatusCode, list[str]]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    return err.value.code(), rpc.bad_fields_of(err.value)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (text_spec("not-a-mac", "hello"), "task.device_id"),
        (text_spec("AA:BB:CC:DD:EE", "hello"), "task.device_id"),
        (text_spec("AA-BB-CC-DD-EE-01", ""), "task.text"),
        (text_spec("AA-BB-CC-DD-EE-01", "   "), "task.text"),
        (
            intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-01", type=types_pb2.TASK_TYPE_UNSPECIFIED, text="x"),
            "task.type",
        ),
        (intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-01", type=7, text="x"), "task.type"),
        (text_spec("AA-BB-CC-DD-EE-01", "x" * (64 * 1024 + 1)), "task.text"),
        (text_spec("AA-BB-CC-DD-EE-01", "x", priority=9), "task.priority"),
        (
            intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-01", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=b"hello"),
            "task.image",
        ),
        (
            intake_pb2.TaskSpec(
                device_id="AA-BB-CC-DD-EE-01", type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url="file:///etc/passwd"
            ),
            "task.image_url",
        ),
        (intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-01", type=types_pb2.TASK_TYPE_OCR_IMAGE), "task.image"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_leaves_nothing_behind(
    platform_without_workers: Platform, spec: intake_pb2.TaskSpec, field: str
) -> None:
    code, fields = await refused_field(platform_without_workers, spec)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == [field]
    await assert_nothing_recorded(platform_without_workers)


async def test_an_oversized_image_is_refused_naming_the_field(platform_without_workers: Platform) -> None:
    big = PNG + b"\x00" * (10 * 1024 * 1024)
    spec = intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-01", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=big)
    code, fields = await refused_field(platform_without_workers, spec)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["task.image"])
    await assert_nothing_recorded(platform_without_workers)


async def test_one_bad_item_refuses_the_whole_batch_naming_its_index(platform_without_workers: Platform) -> None:
    specs = [text_spec("AA-BB-CC-DD-EE-01", "fine"), text_spec("zz", "fine")]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform_without_workers.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc.bad_fields_of(err.value) == ["tasks[1].device_id"]
    await assert_nothing_recorded(platform_without_workers)


async def test_an_image_task_is_accepted_and_queued(platform_without_workers: Platform) -> None:
    spec = intake_pb2.TaskSpec(device_id="aabb.ccdd.ee01", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
    reply = await platform_without_workers.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    assert reply.task.type == types_pb2.TASK_TYPE_OCR_IMAGE
    assert await platform_without_workers.queues.pending() == 1


async def test_a_full_device_is_refused_with_retry_info_while_others_are_accepted(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given a per-device limit of 3 and no workers
    settings = settings.replace(max_per_device_pending=3)
    app = await build_intake(settings, Stores.of(redis=redis, pool=pg))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        for i in range(3):
            await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", f"t{i}")))
        # When the noisy device submits one more
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", "one too many")))
        # Then it is refused with a retry delay, and marked overloaded
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        delay = rpc.retry_delay_of(err.value)
        assert delay is not None and 1 <= delay <= settings.aging_max_wait_s
        assert await redis.sismember(Keys(settings.redis_prefix).overloaded, "AA:BB:CC:DD:EE:01")
        # And another device is still accepted
        await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-02", "quiet device")))
        assert await pg.fetchval("SELECT count(*) FROM tasks") == 4
    await server.stop(1)


async def test_the_global_limit_refuses_with_a_retry_delay_within_the_configured_maximum(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    settings = settings.replace(max_total_pending=2)
    app = await build_intake(settings, Stores.of(redis=redis, pool=pg))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        await stub.SubmitBatch(
            intake_pb2.SubmitBatchRequest(tasks=[text_spec(f"AA-BB-CC-DD-EE-0{i}", "x") for i in (1, 2)])
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-03", "x")))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # the delay comes from the measured drain rate, jittered (tests/unit/scheduler_svc/test_drain.py);
        # retry_after_s (30 s) is its upper bound
        assert 0 < (rpc.retry_delay_of(err.value) or 0) <= settings.retry_after_s
        assert await pg.fetchval("SELECT count(*) FROM tasks") == 2
    await server.stop(1)


async def test_a_caller_without_a_known_token_is_unauthenticated(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    settings = settings.replace(auth_tokens=f"svc-a:client:{hash_token('secret-a')}", allow_anonymous=False)
    app = await build_intake(settings, Stores.of(redis=redis, pool=pg))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    request = intake_pb2.SubmitRequest(task=text_spec("AA-BB-CC-DD-EE-01", "x"))
    async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Submit(request, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = await stub.Submit(request, metadata=(("authorization", "Bearer secret-a"),))
        row = await pg.fetchrow("SELECT caller FROM tasks WHERE id = $1::uuid", reply.task.task_id)
        assert row["caller"] == "svc-a"
    await server.stop(1)


async def test_a_repeated_idempotency_key_returns_the_first_task(platform_without_workers: Platform) -> None:
    spec = text_spec("AA-BB-CC-DD-EE-01", "same job", idempotency_key="job-42")
    first = await platform_without_workers.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    second = await platform_without_workers.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    assert second.task.task_id == first.task.task_id
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert await platform_without_workers.queues.pending() == 1
