"""Which failures are retried and which fail at once, as the worker decides them (worker_svc/detection.py):

- an image_url against a real HTTP server on loopback: timeouts, connection errors, HTTP 5xx / 408 / 429 come
  back as counted retries; HTTP 4xx, a refused destination and an undecodable image FAIL the task;
- a PostgreSQL write that fails (a real pool, closed) nacks the batch, each attempt counted;
- a batch whose run raises is nacked whole, each task's attempt counted, and its slots are freed;
- a worker whose stream broke re-announces what it runs and what it could not deliver in its next hello.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from sieve.db.tasks import Started, TaskStore
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, types_pb2
from worker_svc.detection import TRANSIENT, Retry, detect_text
from worker_svc.group_commit import GroupCommit
from worker_svc.lexicon import Lexicon
from worker_svc.pressure import Pressure
from worker_svc.puller import Puller
from worker_svc.resources import ResourceSampler
from worker_svc.runner import BatchRunner

web = pytest.importorskip("aiohttp.web")


def started(task_type: str = "OCR_IMAGE", **payload: object) -> Started:
    return Started(
        uuid.uuid4(),
        task_type,
        1,
        payload.get("text"),
        payload.get("image"),  # type: ignore[arg-type]
        payload.get("image_url"),
        None,
    )  # type: ignore[arg-type]


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[str]:
    """/status/<n> answers HTTP n; /slow answers after 3 s."""

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]), body=b"no")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(body=b"late")

    app = web.Application()
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(__import__("importlib").util.find_spec("cv2") is None, reason="the `ocr` extra is not installed")
async def test_image_fetch_and_decode_failures_are_retried_or_failed_by_kind(settings: Settings, http: str) -> None:
    from worker_svc.ocr.pipeline import run_ocr
    from worker_svc.ocr.runtime import OcrRuntime
    from worker_svc.text import Matcher

    runtime = OcrRuntime(settings.replace(outbound_allow_private_nets="127.0.0.0/8", ocr_fetch_timeout_s=0.5))
    matcher = Matcher([])
    try:

        async def outcome(**payload: object) -> object:
            return await run_ocr(started(**payload), runtime, matcher, "w")

        transient = {
            f"{http}/status/503": "HTTP 503",
            f"{http}/status/500": "HTTP 500",
            f"{http}/status/429": "HTTP 429",
            f"{http}/status/408": "HTTP 408",
            f"{http}/slow": "timed out",
            f"http://127.0.0.1:{closed_port()}/x.png": "connection error",
        }
        for url, reason in transient.items():
            result = await outcome(image_url=url)
            assert isinstance(result, Retry), (url, result)
            assert result.kind == TRANSIENT and result.counted and reason in result.reason, (url, result)
        permanent = {
            f"{http}/status/404": "HTTP 404",
            f"{http}/status/400": "HTTP 400",
            f"{http}/status/403": "HTTP 403",
        }
        for url, reason in permanent.items():
            result = await outcome(image_url=url)
            assert not isinstance(result, Retry) and result.verdict is None and reason in (result.error or ""), url
        # a destination the outbound policy refuses, and bytes no decoder reads, fail too
        refused = await run_ocr(started(image_url="http://10.1.2.3/x.png"), OcrRuntime(settings), matcher, "w")
        assert not isinstance(refused, Retry) and "fetch refused" in (refused.error or "")
        garbage = await outcome(image=b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
        assert not isinstance(garbage, Retry) and garbage.verdict is None and garbage.error
    finally:
        await runtime.close()


def test_a_text_task_without_text_fails_at_once() -> None:
    from worker_svc.text import Matcher

    result = detect_text(started("TEXT", text=""), Matcher([]), "w")
    assert result.verdict is None and result.error == "task has no text"


def assignment(task_id: uuid.UUID, lease: int = 1, attempt: int = 1) -> scheduler_pb2.Assignment:
    a = scheduler_pb2.Assignment(
        task_id=str(task_id),
        device_id="AA:BB:CC:DD:EE:01",
        type=types_pb2.TASK_TYPE_TEXT,
        attempt=attempt,
        lease_token=f"{lease}.0123456789abcdef",
    )
    a.assigned_at.FromDatetime(datetime.now(UTC))
    return a


@pytest.mark.parametrize("attempt", [1, 2], ids=["first attempt, read without a mark", "retry, marked RUNNING"])
async def test_a_postgresql_write_that_fails_nacks_the_batch_counted(
    settings: Settings, pg: asyncpg.Pool, attempt: int
) -> None:
    from sieve.db import create_pool

    pool = await create_pool(settings, attempts=1)
    runner = BatchRunner(TaskStore(pool), Lexicon(pool, settings), "w", settings)
    # give up at once (default: retried ~30 s)
    runner.starts = GroupCommit("start", runner._start, max_attempts=1)
    runner.reads = GroupCommit("read", runner._read, max_attempts=1)
    writers = [asyncio.create_task(w.run()) for w in (runner.starts, runner.reads)]
    await pool.close()  # PostgreSQL is away for this worker
    try:
        acks, nacks = await runner(
            [assignment(uuid.uuid4(), attempt=attempt), assignment(uuid.uuid4(), attempt=attempt)]
        )
    finally:
        for writer in writers:
            writer.cancel()
    assert acks == [] and len(nacks) == 2
    assert all(n.count_attempt and "database unavailable" in n.reason for n in nacks)
    assert all(not n.HasField("retry_after") for n in nacks)  # the scheduler's retry backoff applies


def puller(settings: Settings, run_batch: object) -> Puller:
    settings = settings.replace(fixed_resources="cpu=5,memory=5,gpu_memory=0", test_hooks=True)
    return Puller(
        settings,
        "w",
        [types_pb2.TASK_TYPE_TEXT],
        False,
        4,
        run_batch,  # type: ignore[arg-type]
        Pressure(ResourceSampler(settings), settings),
    )


async def test_a_batch_that_raises_is_nacked_whole_each_attempt_counted(settings: Settings) -> None:
    async def broken(assignments: list[scheduler_pb2.Assignment]) -> tuple[list[object], list[object]]:
        raise RuntimeError("the runner broke")

    p = puller(settings, broken)
    p._outbox = asyncio.Queue()
    batch = [assignment(uuid.uuid4()), assignment(uuid.uuid4())]
    p._start_batch(batch)
    await asyncio.gather(*p._running)
    sent = p._outbox.get_nowait()
    assert [n.task_id for n in sent.nacks] == [a.task_id for a in batch]
    assert all(n.count_attempt and "RuntimeError: the runner broke" in n.reason for n in sent.nacks)
    assert p.in_use == 0


async def test_a_reconnecting_worker_re_announces_what_it_runs_and_what_it_could_not_deliver(
    settings: Settings,
) -> None:
    release = asyncio.Event()

    async def slow(assignments: list[scheduler_pb2.Assignment]) -> tuple[list[object], list[object]]:
        await release.wait()
        return [scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token) for a in assignments], []

    p = puller(settings, slow)
    outbox: asyncio.Queue[scheduler_pb2.PullRequest | None] = asyncio.Queue()
    p._outbox = outbox
    running, delivered, unsent = assignment(uuid.uuid4()), assignment(uuid.uuid4()), assignment(uuid.uuid4())
    p._start_batch([running])
    # an ack sent on the stream just before it broke, and one still in its outbox
    sent = scheduler_pb2.PullRequest(
        acks=[scheduler_pb2.Ack(task_id=delivered.task_id, lease_token=delivered.lease_token)]
    )
    p._note_sent(sent)
    outbox.put_nowait(
        scheduler_pb2.PullRequest(acks=[scheduler_pb2.Ack(task_id=unsent.task_id, lease_token=unsent.lease_token)])
    )
    p._outbox = None
    p._stream_ended(outbox)
    # the running one finishes while no stream is open: its ack is owed too
    release.set()
    await asyncio.gather(*p._running)
    first = p._first_request()
    assert first.hello.worker_id == "w"
    held = {h.task_id: h.lease_token for h in first.hello.held}
    assert held == {a.task_id: a.lease_token for a in (running, delivered, unsent)}
    assert sorted(a.task_id for a in first.acks) == sorted(a.task_id for a in (running, delivered, unsent))
    # and the next stream's hello announces nothing more (what was owed went with this one)
    assert not p._first_request().hello.held
