"""The scheduler's ways back and sideways: retries with backoff, dead letters and their RPCs, TTL
expiry, cancellation, the watermark, several replicas, and OCR routing when no GPU worker is alive."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter

import asyncpg
import grpc
import pytest
from google.protobuf import duration_pb2
from redis.asyncio import Redis

from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.db.tasks import Outcome, TaskStore
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, registry_pb2, scheduler_pb2, types_pb2
from tests.integration.conftest import PNG, Platform, platform_with, text_spec, wait_final
from tests.integration.pull_client import ScriptedWorker


def always_fail(_: scheduler_pb2.Assignment) -> scheduler_pb2.Nack:
    return scheduler_pb2.Nack(reason="transient failure", count_attempt=True)


async def status_of(p: Platform, task_id: str) -> str:
    return await p.pg.fetchval("SELECT status FROM tasks WHERE id = $1::uuid", task_id)


async def eventually(check, timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def submit(p: Platform, spec: intake_pb2.TaskSpec) -> str:
    return (await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id


async def test_a_failing_task_is_retried_with_backoff_then_dead_lettered_and_can_be_requeued(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, max_attempts=3, retry_backoff_base_s=0.1) as p:
        # Given a worker that fails every attempt
        task_id = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "加微信"))
        async with ScriptedWorker(p.settings, policy=always_fail) as worker:
            # Then the task is tried max_attempts times, with growing delays, and dead-lettered
            await eventually(lambda: _is(p, task_id, "DEAD_LETTERED"))
            attempts = [a.attempt for a in worker.received]
        assert attempts == [1, 2, 3]
        letters = (await p.scheduler_stub.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest())).dead_letters
        assert [(d.task_id, d.device_id, d.attempts, d.error) for d in letters] == [
            (task_id, "AA:BB:CC:DD:EE:01", 3, "transient failure")
        ]
        assert await p.queues.pending() == 0
        # When an operator requeues it by id, with a real worker running
        await p.add_worker(worker_id="real-1")
        reply = await p.scheduler_stub.RequeueDeadLetters(
            scheduler_pb2.RequeueDeadLettersRequest(filter=scheduler_pb2.DeadLetterFilter(task_id=task_id))
        )
        assert list(reply.task_ids) == [task_id]
        # Then it succeeds, keeping its id and its whole history
        task = await wait_final(p.intake, task_id)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED
        statuses = [types_pb2.TaskStatus.Name(h.status).removeprefix("TASK_STATUS_") for h in task.history]
        assert statuses[0] == "PENDING" and "DEAD_LETTERED" in statuses and statuses[-1] == "SUCCEEDED"
        assert (await p.scheduler_stub.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest())).total == 0


async def _is(p: Platform, task_id: str, status: str) -> bool:
    return await status_of(p, task_id) == status


async def test_dead_letters_can_be_listed_filtered_requeued_all_and_purged(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, max_attempts=1) as p:
        ids = [await submit(p, text_spec(f"AA-BB-CC-DD-EE-0{i}", f"text {i}")) for i in range(1, 5)]
        async with ScriptedWorker(p.settings, policy=always_fail):
            for task_id in ids:
                await eventually(lambda t=task_id: _is(p, t, "DEAD_LETTERED"))
        stub = p.scheduler_stub
        one = await stub.ListDeadLetters(
            scheduler_pb2.ListDeadLettersRequest(filter=scheduler_pb2.DeadLetterFilter(device_id="aabb.ccdd.ee02"))
        )
        assert [d.task_id for d in one.dead_letters] == [ids[1]] and one.total == 4
        # an empty filter needs all=true, and a bad filter names its field
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.PurgeDeadLetters(scheduler_pb2.PurgeDeadLettersRequest())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc.bad_fields_of(err.value) == ["all"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListDeadLetters(
                scheduler_pb2.ListDeadLettersRequest(filter=scheduler_pb2.DeadLetterFilter(device_id="nope"))
            )
        assert rpc.bad_fields_of(err.value) == ["filter.device_id"]
        purged = await stub.PurgeDeadLetters(
            scheduler_pb2.PurgeDeadLettersRequest(
                filter=scheduler_pb2.DeadLetterFilter(error_contains="transient", device_id="AA:BB:CC:DD:EE:01")
            )
        )
        assert purged.purged == 1
        requeued = await stub.RequeueDeadLetters(scheduler_pb2.RequeueDeadLettersRequest(all=True))
        assert sorted(requeued.task_ids) == sorted(ids[1:])
        assert await p.queues.pending() == 3
        assert [await status_of(p, t) for t in ids] == ["DEAD_LETTERED", "PENDING", "PENDING", "PENDING"]


async def test_a_task_whose_ttl_passes_in_the_queue_becomes_expired(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, ttl_sweep_interval_s=0.2) as p:
        short = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "short", ttl=duration_pb2.Duration(seconds=1)))
        long = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "long"))
        await eventually(lambda: _is(p, short, "EXPIRED"))
        assert await status_of(p, long) == "PENDING"
        assert await p.queues.pending() == 1
        assert [e.task_id for e in await p.queues.queued("AA:BB:CC:DD:EE:01")] == [long]


async def test_an_expired_task_is_never_handed_out(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with platform_with(settings, redis, pg, ttl_sweep_interval_s=3600) as p:
        task_id = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "x", ttl=duration_pb2.Duration(nanos=300_000_000)))
        await asyncio.sleep(0.5)
        async with ScriptedWorker(p.settings) as worker:
            await eventually(lambda: _is(p, task_id, "EXPIRED"))
        assert worker.received == []
        assert await p.queues.pending() == 0


async def test_cancelling_a_pending_task_removes_it_from_its_queue(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    keep = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "keep"))
    drop = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "drop"))
    reply = await p.intake.CancelTask(intake_pb2.CancelTaskRequest(task_id=drop))
    assert reply.task.status == types_pb2.TASK_STATUS_CANCELLED
    assert [e.task_id for e in await p.queues.queued("AA:BB:CC:DD:EE:01")] == [keep]
    assert await p.queues.pending() == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await p.intake.CancelTask(intake_pb2.CancelTaskRequest(task_id=str(uuid.uuid4())))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_result_of_a_task_cancelled_while_running_is_discarded(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    task_id = await submit(p, text_spec("AA-BB-CC-DD-EE-01", "running"))
    store = TaskStore(p.pg)
    from datetime import UTC, datetime

    [started] = await store.start("w1", [(uuid.UUID(task_id), 1, 1, datetime.now(UTC))])
    await p.intake.CancelTask(intake_pb2.CancelTaskRequest(task_id=task_id))
    stored = await store.finish([Outcome(started.task_id, 1, "w1", "PASS", "[]", "running")])
    assert stored == set()
    assert await status_of(p, task_id) == "CANCELLED"
    assert await p.pg.fetchval("SELECT count(*) FROM results") == 0


async def test_the_watermark_tells_pending_overloaded_backed_off_and_dead(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(
        settings,
        redis,
        pg,
        max_per_device_pending=2,
        watermark_interval_s=0.1,
        max_attempts=2,
        retry_backoff_base_s=0.05,
    ) as p:
        for i in range(2):
            await submit(p, text_spec("AA-BB-CC-DD-EE-01", f"t{i}"))
        with pytest.raises(grpc.aio.AioRpcError):
            await submit(p, text_spec("AA-BB-CC-DD-EE-01", "over"))
        mark = await p.scheduler_stub.GetWatermark(scheduler_pb2.GetWatermarkRequest())
        assert (mark.overloaded_devices, mark.total_pending, mark.active_devices) == (["AA:BB:CC:DD:EE:01"], 2, 1)
        ocr = intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-02", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
        ocr_id = await submit(p, ocr)
        doomed = await submit(p, text_spec("AA-BB-CC-DD-EE-03", "doomed"))
        # a text-only worker: the OCR task waits out a delay (its type only; no device backs off), the doomed
        # task fails once and is dead-lettered
        async with ScriptedWorker(
            p.settings,
            credits=1,
            policy=lambda a: (
                always_fail(a)
                if a.task_id == doomed
                else scheduler_pb2.Nack(retry_after=duration_pb2.Duration(seconds=60), reason="hold")
            ),
        ) as _:
            await eventually(lambda: _is(p, doomed, "DEAD_LETTERED"))
            await asyncio.sleep(0.3)
            mark = await p.scheduler_stub.GetWatermark(scheduler_pb2.GetWatermarkRequest())
        assert mark.backoff_devices == []
        assert await _delayed(p, ocr_id)
        assert mark.dead_letters == 1
        assert mark.active_devices == 0  # what is left of both devices waits out retry delays
        record = json.loads(await redis.get(p.queues.keys.watermark))
        assert set(record) == {"total_pending", "mac_count", "active_workers", "timestamp"}
        assert 0 < await redis.pttl(p.queues.keys.watermark) <= 20_000


async def test_two_scheduler_replicas_never_hand_out_a_task_twice(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, max_total_pending=10_000) as p:
        # Given a second scheduler replica on the same Redis, each with its own worker (storing results before its
        # acks, as a real one does: an ack without one is put back and handed out again)
        service = (await build_scheduler(p.settings, Stores.of(redis=redis, pool=pg))).service
        second = await rpc.create_server(service, "127.0.0.1:0", p.settings)
        specs = [text_spec(f"0A:00:00:00:00:{d:02x}", f"t{i}") for d in range(50) for i in range(20)]
        async with (
            ScriptedWorker(p.settings, worker_id="w-a", credits=20, results=TaskStore(p.pg)) as a,
            ScriptedWorker(
                p.settings.replace(scheduler_addr=f"127.0.0.1:{second.port}"),
                worker_id="w-b",
                credits=20,
                results=TaskStore(p.pg),
            ) as b,
        ):
            # When 1 000 tasks over 50 devices are submitted
            for i in range(0, len(specs), 200):
                await p.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[i : i + 200]))
            await eventually(lambda: _count(a, b, 1000), timeout_s=30)
            # Then both replicas served, and no task was handed out twice
            counts = Counter(x.task_id for x in [*a.received, *b.received])
            assert len(counts) == 1000 and set(counts.values()) == {1}
            assert a.received and b.received
        await second.stop(1)


async def _count(a: ScriptedWorker, b: ScriptedWorker, n: int) -> bool:
    return len(a.received) + len(b.received) >= n


async def _gpu_workers_expected(p: Platform) -> None:
    """A GPU worker that takes OCR was alive a moment ago (what any replica records on seeing one)."""
    await p.redis.set(p.queues.keys.gpu_expected, "1", px=60_000)
    await eventually(lambda: _router_expects_gpus(p))


async def _router_expects_gpus(p: Platform) -> bool:
    return p.scheduler.dispatcher.router.gpu_expected


@pytest.mark.parametrize("strategy", ["defer", "cpu", "dead_letter"])
async def test_ocr_with_only_cpu_workers_follows_the_no_gpu_strategy_while_gpu_workers_are_expected(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, strategy: str
) -> None:
    async with platform_with(settings, redis, pg, no_gpu_strategy=strategy) as p:
        # Given GPU workers that were alive recently and are gone now
        await _gpu_workers_expected(p)
        task_id = await submit(
            p, intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-07", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
        )
        async with ScriptedWorker(
            p.settings,
            worker_id="cpu-1",
            gpu=False,
            task_types=(types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE),
        ) as cpu:
            if strategy == "cpu":
                await cpu.wait_for(1)
                assert cpu.received[0].task_id == task_id
                detail = "routed to a CPU worker"
            elif strategy == "defer":
                # the image waits out a delay on its own (the device is not backed off) ...
                await eventually(lambda: _delayed(p, task_id))
                assert not await _in_backoff(p, "AA:BB:CC:DD:EE:07")
                detail = "no GPU worker alive (strategy defer)"
                # ... and a text of the same device submitted after it is served at once
                text = await submit(p, text_spec("AA-BB-CC-DD-EE-07", "hello"))
                await cpu.wait_for(1)
                assert cpu.received[0].task_id == text
            else:
                await eventually(lambda: _is(p, task_id, "DEAD_LETTERED"))
                assert cpu.received == []
                detail = "no GPU worker alive (strategy dead_letter)"
            await eventually(lambda: _noted(p, task_id, detail))


async def test_a_fleet_without_gpus_runs_ocr_on_cpu_workers_with_the_default_strategy(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg) as p:
        # Given the default strategy (defer) and no GPU worker seen, ever
        assert p.settings.no_gpu_strategy == "defer"
        image = await submit(
            p, intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-0A", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
        )
        text = await submit(p, text_spec("AA-BB-CC-DD-EE-0A", "hello"))
        # When a CPU worker that takes OCR connects, Then it gets both, the image first
        async with ScriptedWorker(
            p.settings,
            worker_id="cpu-2",
            gpu=False,
            task_types=(types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE),
        ) as cpu:
            await eventually(lambda: _got(cpu, 2))
            assert _first_seen(cpu) == [image, text]
        assert not p.scheduler.dispatcher.router.gpu_expected


async def test_a_gpu_worker_registered_and_then_gone_makes_ocr_wait_until_the_window_passes(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(
        settings, redis, pg, gpu_expected_s=2.5, defer_backoff_base_s=0.5, defer_backoff_max_s=1.0
    ) as p:
        # Given a GPU worker that takes OCR, registered and then gone (its record removed)
        records = WorkerRecords(redis, p.settings)
        await records.save(
            registry_pb2.RegisterRequest(
                worker_id="gpu-9",
                hostname="h",
                pid=1,
                task_types=[types_pb2.TASK_TYPE_OCR_IMAGE],
                resources=registry_pb2.Resources(gpu_available=True, gpu_count=1),
            )
        )
        await eventually(lambda: _router_expects_gpus(p))
        await records.remove("gpu-9")
        gone = asyncio.get_running_loop().time()
        async with ScriptedWorker(
            p.settings,
            worker_id="cpu-3",
            gpu=False,
            task_types=(types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE),
        ) as cpu:
            # When an image and then a text of one device come
            image = await submit(
                p, intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-0B", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
            )
            text = await submit(p, text_spec("AA-BB-CC-DD-EE-0B", "hello"))
            # Then the text is served at once while the image waits (strategy defer) ...
            await cpu.wait_for(1)
            assert cpu.received[0].task_id == text
            await eventually(lambda: _noted(p, image, "no GPU worker alive (strategy defer)"))
            # ... and once no GPU worker has been alive for the window, the CPU worker runs the image
            await eventually(lambda: _got(cpu, 2), timeout_s=15)
            assert _first_seen(cpu) == [text, image]
            assert asyncio.get_running_loop().time() - gone >= 2.0


async def test_a_worker_that_says_mid_stream_it_lost_its_gpu_gets_no_more_gpu_routed_work(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, no_gpu_strategy="dead_letter") as p:
        ocr = (types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE)
        async with ScriptedWorker(p.settings, worker_id="gpu-1", gpu=True, task_types=ocr) as worker:
            # Given a GPU worker that took an image
            first = await submit(
                p, intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-08", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
            )
            await worker.wait_for(1)
            assert worker.received[0].task_id == first
            # When it says on the same stream that it now runs on the CPU
            worker.announce(gpu=False)
            await eventually(lambda: _session_gpu(p, "gpu-1", False))
            # Then the next image meets "no GPU worker alive" (here: dead-lettered), and text still flows
            second = await submit(
                p, intake_pb2.TaskSpec(device_id="AA-BB-CC-DD-EE-08", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
            )
            await eventually(lambda: _is(p, second, "DEAD_LETTERED"))
            await eventually(lambda: _noted(p, second, "no GPU worker alive (strategy dead_letter)"))
            text = await submit(p, text_spec("AA-BB-CC-DD-EE-09", "hello"))
            await worker.wait_for(2)
            assert [a.task_id for a in worker.received] == [first, text]
            assert worker.error is None  # the stream was never reopened


async def _session_gpu(p: Platform, worker_id: str, gpu: bool) -> bool:
    return any(s.worker_id == worker_id and s.gpu == gpu for s in p.scheduler.board.sessions)


async def _noted(p: Platform, task_id: str, detail: str) -> bool:
    history = await p.pg.fetchval("SELECT history FROM tasks WHERE id = $1::uuid", task_id)
    return any(detail in h["detail"] for h in history)


async def _in_backoff(p: Platform, mac: str) -> bool:
    return (await p.queues.device_meta(mac)).get("state") == "backoff"


def _first_seen(worker: ScriptedWorker) -> list[str]:
    """Task ids in the order they first reached the worker (a scripted ack stores no result: the task comes
    back, and may reach it again)."""
    return list(dict.fromkeys(a.task_id for a in worker.received))


async def _got(worker: ScriptedWorker, distinct: int) -> bool:
    return len(_first_seen(worker)) >= distinct


async def _delayed(p: Platform, task_id: str) -> bool:
    return any(f"|{task_id}|" in m for m in await p.redis.zrange(p.queues.keys.delayed, 0, -1))
