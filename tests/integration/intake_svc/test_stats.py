"""GetStats against real intake, scheduler and worker servers and the real PostgreSQL: after a mixed workload (texts
run by a real worker, OCR results and failures stored as an OCR worker stores them, cancellations, a dead letter
requeued, device reports), and after OCR run by a real OCR worker (rendered images, a fetched one, a missing one),
its counts, percentiles and top words match what the tasks, results and device_reports tables say; a client sees
only its own statistics, an operator every caller's or one's; bad input is refused naming the field; the queries
read indexes."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc
import pytest
from aiohttp import web
from google.protobuf import timestamp_pb2
from redis.asyncio import Redis

from intake_svc.result_view import processing_time_ms
from sieve.db.stats import StatsQuery, bucket_of, fold, percentile_ms, queue_sql
from sieve.db.tasks import NewTask, Outcome, TaskStore, Unmarked
from sieve.ids import uuid7
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import PNG, Platform, platform_with, text_spec, wait_final
from tests.ocr_samples import SAMPLES, render, require_cjk_font
from tests.security.test_tenants import as_, intake
from tests.support.receiver import serving

DEVICES = ["AA:BB:CC:30:00:01", "AA:BB:CC:30:00:02", "AA:BB:CC:30:00:03"]
TEXTS = ["这里有 赌博 广告", "加 微 信 免费领取", "今天天气很好", "赌博 和 赌博"]
STATUS_FIELDS = {
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "EXPIRED": "expired",
    "CANCELLED": "cancelled",
    "DEAD_LETTERED": "dead_lettered",
}


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(moment)
    return ts


def verdict_name(value: int) -> str:
    return types_pb2.Verdict.Name(value).removeprefix("VERDICT_") if value else ""


def type_name(value: int) -> str:
    return types_pb2.TaskType.Name(value).removeprefix("TASK_TYPE_")


async def ocr_results(store: TaskStore, task_ids: list[str], fail_every: int) -> None:
    """Stores OCR results as an OCR worker does (TaskStore.finish of a hand-out run without a RUNNING mark): every
    `fail_every`th one failed, the others with hits and stage timings."""
    now = datetime.now(UTC)
    outcomes = []
    for n, task_id in enumerate(task_ids):
        failed = n % fail_every == 0
        hits = [
            {"word": "赌博", "category": "gambling", "severity": 4, "start": 0, "end": 2, "matched_text": "赌博"},
            {"word": "casino", "category": "gambling", "severity": 3, "start": 3, "end": 9, "matched_text": "casino"},
        ]
        details = {"timings_ms": {"fetch": 2.0, "detect": 40.0 + n, "recognise": 30.0, "total": 80.0 + 7 * n}}
        outcomes.append(
            Outcome(
                uuid.UUID(task_id),
                1,
                "ocr-worker-1",
                None if failed else "BLOCK",
                json.dumps([] if failed else hits),
                "" if failed else "赌博 casino",
                json.dumps(details),
                error="image could not be decoded" if failed else None,
                unmarked=Unmarked(1, now, now),
            )
        )
    assert len(await store.finish(outcomes)) == len(outcomes)


async def expected_from_tables(pg: asyncpg.Pool) -> dict[str, object]:
    """What GetStats should say, computed from the tasks, results and device_reports tables themselves."""
    tasks = await pg.fetch(
        "SELECT t.device, t.type, t.status, coalesce(r.verdict, '') AS verdict, r.hits, r.details "
        "FROM tasks t LEFT JOIN results r ON r.task_id = t.id"
    )
    buckets: Counter[tuple[str, str, str, str]] = Counter()
    histogram: Counter[int] = Counter()
    words: Counter[tuple[str, str]] = Counter()
    queue: Counter[str] = Counter()
    for t in tasks:
        if t["status"] in STATUS_FIELDS:
            buckets[(t["device"], t["type"], t["verdict"], STATUS_FIELDS[t["status"]])] += 1
        else:
            queue[t["status"]] += 1
        if t["status"] == "SUCCEEDED":
            timings = {k: float(v) for k, v in t["details"].get("timings_ms", {}).items()}
            histogram[bucket_of(processing_time_ms(timings))] += 1
            words.update((h["word"], h["category"]) for h in t["hits"])
    for r in await pg.fetch("SELECT device, subject, verdict, hits FROM device_reports"):
        buckets[(r["device"], "TEXT" if r["subject"] == "text" else "OCR_IMAGE", r["verdict"], "reported")] += 1
        words.update((h["word"], h["category"]) for h in r["hits"])
    dense = tuple(histogram.get(b, 0) for b in range(max(histogram, default=-1) + 1))
    return {"buckets": buckets, "histogram": dense, "words": words, "queue": queue}


def counted(reply: intake_pb2.GetStatsResponse) -> Counter[tuple[str, str, str, str]]:
    out: Counter[tuple[str, str, str, str]] = Counter()
    for b in reply.buckets:
        for field in (*STATUS_FIELDS.values(), "reported"):
            n = getattr(b.counts, field)
            if n:
                out[(b.device_id, type_name(b.type), verdict_name(b.verdict), field)] += n
    return out


async def test_get_stats_matches_the_task_table_after_a_mixed_workload(platform: Platform) -> None:
    stub, store = platform.intake, TaskStore(platform.pg)
    # Given texts run by the real worker on three devices (hits and passes)
    texts = []
    for n in range(18):
        spec = text_spec(DEVICES[n % 3], TEXTS[n % 4])
        texts.append((await stub.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id)
    # and OCR tasks (no OCR worker runs here: they wait) of which some are cancelled, one dead-lettered and requeued,
    # one dead-lettered for good, and the rest stored as an OCR worker stores them, every third failed
    ocr = []
    for n in range(14):
        spec = intake_pb2.TaskSpec(device_id=DEVICES[n % 2], type=types_pb2.TASK_TYPE_OCR_IMAGE, image=PNG)
        ocr.append((await stub.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id)
    for task_id in ocr[:3]:
        await stub.CancelTask(intake_pb2.CancelTaskRequest(task_id=task_id))
    dead = [uuid.UUID(ocr[3]), uuid.UUID(ocr[4])]
    assert sorted(await store.transition(dead, "DEAD_LETTERED", "gave up")) == sorted(dead)
    assert [r["id"] for r in await store.revive(dead[:1], "requeued", 60)] == dead[:1]
    await ocr_results(store, ocr[5:12], fail_every=3)
    # ocr[12:] and the revived one stay PENDING
    # and devices report detections of their own
    hit = types_pb2.Hit(word="赌博", category="gambling", severity=4, start=0, end=2, matched_text="赌博")
    reports: list[dict[str, Any]] = [
        {"text": "没事", "verdict": types_pb2.VERDICT_PASS},
        {"text": "赌博", "verdict": types_pb2.VERDICT_BLOCK, "hits": [hit]},
        {"image_ref": "img-2.png", "verdict": types_pb2.VERDICT_PASS},
        {"image_ref": "img-3.png", "verdict": types_pb2.VERDICT_BLOCK, "hits": [hit]},
    ]
    for n, fields in enumerate(reports):
        detected = stamp(datetime.now(UTC) - timedelta(seconds=5))
        await stub.ReportDetection(
            intake_pb2.ReportDetectionRequest(
                device_id=DEVICES[n % 3], report_id=f"r-{n}", detected_at=detected, **fields
            )
        )
    for task_id in texts:
        task = await wait_final(stub, task_id)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task

    # When the stats of today are asked for, by device
    reply = await stub.GetStats(intake_pb2.GetStatsRequest(by_device=True, top=5))

    # Then every count is what the tables say, and so are the percentiles, the top words and the queue
    expected = await expected_from_tables(platform.pg)
    assert counted(reply) == expected["buckets"]
    totals = reply.totals
    assert totals.finished == sum(n for k, n in expected["buckets"].items() if k[3] != "reported")  # type: ignore[attr-defined]
    assert (totals.succeeded, totals.failed, totals.cancelled, totals.dead_lettered) == (18 + 4, 3, 3, 1)
    assert totals.reported == 4
    histogram = expected["histogram"]
    assert totals.p50_processing_time_ms == pytest.approx(percentile_ms(histogram, 0.5), abs=1e-3)  # type: ignore[arg-type]
    assert totals.p95_processing_time_ms == pytest.approx(percentile_ms(histogram, 0.95), abs=1e-3)  # type: ignore[arg-type]
    assert totals.p95_processing_time_ms > 80  # the OCR tasks' totals, not the texts' match times
    words = expected["words"]
    assert [(w.word, w.category, w.hits) for w in reply.top_words] == [
        (w, c, n)
        for (w, c), n in sorted(words.items(), key=lambda i: (-i[1], i[0]))[:5]  # type: ignore[attr-defined]
    ]
    assert reply.top_categories[0].category == "gambling"
    assert (reply.queue.pending, reply.queue.assigned, reply.queue.running) == (
        expected["queue"]["PENDING"],  # type: ignore[index]
        expected["queue"]["ASSIGNED"],  # type: ignore[index]
        expected["queue"]["RUNNING"],  # type: ignore[index]
    )
    assert reply.queue.pending == 3 and not reply.truncated
    # and by the hour, summed over devices, the totals are the same; a type filter keeps that type's only
    hourly = await stub.GetStats(intake_pb2.GetStatsRequest(granularity=intake_pb2.STATS_GRANULARITY_HOUR))
    assert hourly.totals == reply.totals
    assert all(not b.device_id for b in hourly.buckets)
    only_ocr = await stub.GetStats(intake_pb2.GetStatsRequest(type=types_pb2.TASK_TYPE_OCR_IMAGE))
    assert {b.type for b in only_ocr.buckets} == {types_pb2.TASK_TYPE_OCR_IMAGE}
    assert only_ocr.totals.succeeded == 4 and only_ocr.queue.pending == 3
    one_device = await stub.GetStats(intake_pb2.GetStatsRequest(device_id=DEVICES[2].lower()))
    assert one_device.totals.succeeded == 6 and one_device.totals.reported == 1
    # and a range before any task counts nothing
    before = await stub.GetStats(intake_pb2.GetStatsRequest(end_time=stamp(datetime.now(UTC) - timedelta(days=2))))
    assert not before.buckets and before.totals.finished == 0


async def test_a_client_sees_only_its_own_stats_and_an_operator_any_callers(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as i:
        # Given alice and bob each have tasks, some cancelled, and a device report
        for who, device, n in (("alice", "AA:BB:CC:31:00:01", 5), ("bob", "BB:BB:CC:31:00:01", 3)):
            items = await i.batch(who, [text_spec(device, f"{who} {k}") for k in range(n)])
            for item in items[:2]:
                await i.stub.CancelTask(intake_pb2.CancelTaskRequest(task_id=item.task.task_id), metadata=as_(who))
            await i.stub.ReportDetection(
                intake_pb2.ReportDetectionRequest(
                    device_id=device,
                    report_id="r1",
                    detected_at=stamp(datetime.now(UTC)),
                    image_ref="a.png",
                    verdict=types_pb2.VERDICT_PASS,
                ),
                metadata=as_(who),
            )

        async def stats(who: str, **fields: Any) -> intake_pb2.GetStatsResponse:
            reply: intake_pb2.GetStatsResponse = await i.stub.GetStats(
                intake_pb2.GetStatsRequest(**fields), metadata=as_(who)
            )
            return reply

        # When each asks, alice sees hers only (by_caller shows whose), bob his
        alice = await stats("alice", by_caller=True)
        assert {b.caller for b in alice.buckets} == {"alice"}
        assert (alice.totals.cancelled, alice.totals.reported, alice.queue.pending) == (2, 1, 3)
        assert (await stats("alice", caller="alice")).totals == alice.totals
        bob = await stats("bob")
        assert (bob.totals.cancelled, bob.totals.reported, bob.queue.pending) == (2, 1, 1)
        # and alice naming bob is refused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stats("alice", caller="bob")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # while the operator sees everybody's, by caller, or one caller's
        everyone = await stats("ops", by_caller=True)
        assert {b.caller for b in everyone.buckets} == {"alice", "bob"}
        assert (everyone.totals.cancelled, everyone.totals.reported, everyone.queue.pending) == (4, 2, 4)
        assert (await stats("ops", caller="bob")).totals == bob.totals


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"granularity": 7}, "granularity"),
        ({"type": 9}, "type"),
        ({"device_id": "not a mac"}, "device_id"),
        ({"top": 101}, "top"),
        ({"caller": "a\x00b"}, "caller"),
        (
            {
                "start_time": stamp(datetime(2024, 1, 2, tzinfo=UTC)),
                "end_time": stamp(datetime(2024, 1, 1, tzinfo=UTC)),
            },
            "end_time",
        ),
        (
            {
                "start_time": stamp(datetime(2024, 1, 1, tzinfo=UTC)),
                "end_time": stamp(datetime(2024, 3, 1, tzinfo=UTC)),
                "granularity": intake_pb2.STATS_GRANULARITY_HOUR,
            },
            "start_time",
        ),
        ({"end_time": timestamp_pb2.Timestamp(seconds=-5)}, "end_time"),
    ],
)
async def test_bad_stats_requests_are_invalid_argument_naming_the_field(
    platform_without_workers: Platform, fields: dict[str, object], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform_without_workers.intake.GetStats(intake_pb2.GetStatsRequest(**fields))  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}:"), err.value.details()


async def test_too_many_buckets_are_cut_at_a_period_with_the_totals_whole(pg: asyncpg.Pool) -> None:
    from sieve.db.stats import read_stats

    # Given rollups of 3 hours x 4 devices (written as the trigger writes them)
    hour = datetime(2024, 5, 1, 10, tzinfo=UTC)
    for h in range(3):
        for d in range(4):
            await pg.execute(
                "INSERT INTO task_stats (caller, hour, device, type, verdict, succeeded, processing_ms) "
                "VALUES ('c', $1, $2, 'TEXT', 'PASS', 2, '{0, 2}')",
                hour + timedelta(hours=h),
                f"D{d}",
            )
    query = StatsQuery("c", hour, hour + timedelta(hours=3), daily=False, by_device=True)
    # When at most 6 buckets may be answered
    stats = await read_stats(pg, query, max_buckets=6)
    # Then the first hour's 4 come (the second hour is not whole), and where to go on; the totals count all 12
    assert [(b.start, b.device) for b in stats.buckets] == [(hour, f"D{d}") for d in range(4)]
    assert stats.truncated and stats.next_start == hour + timedelta(hours=1)
    assert stats.totals.succeeded == 24 and stats.totals.histogram == (0, 24)
    assert stats.buckets[0].counts.histogram == (0, 2)


async def test_the_stats_queries_read_indexes_not_the_tables(pg: asyncpg.Pool) -> None:
    from sieve.db.stats import _Filter, groups_sql

    query = StatsQuery("alice", datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 2, tzinfo=UTC), daily=True)
    async with pg.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")  # tiny tables: the planner would scan them whole
        where = _Filter(query)
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + groups_sql(query, where, 10), *where.params))
        assert "task_stats_pkey" in plan, plan
        sql, params = queue_sql(query)
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *params))
        # each partition's share of tasks_open_caller (named after its columns), read alone
        assert "caller_status_idx" in plan and "Index Only Scan" in plan, plan


async def test_a_result_with_odd_timings_is_stored_and_counted(pg: asyncpg.Pool, settings: Settings) -> None:
    # Given a task whose result's details hold timings of unexpected shapes (the trigger must never fail a write)
    from sieve.db.tasks import NewTask

    store = TaskStore(pg)
    now = datetime.now(UTC)
    ids = []
    for details in ('{"timings_ms": {"match": "fast", "x": true, "total": 1e400}}', '{"timings_ms": [1, 2]}', "{}"):
        task = NewTask(
            uuid7(), "AA:BB:CC:32:00:01", types_pb2.TASK_TYPE_TEXT, 3, "c", now, now + timedelta(hours=1), text="t"
        )
        await store.insert([task])
        ids.append(task.task_id)
        outcome = Outcome(task.task_id, 1, "w", "PASS", "{}", "t", details, unmarked=Unmarked(1, now, now))
        # When it is stored
        assert await store.finish([outcome]) == {task.task_id}
    # Then, once folded (GetStats and the scheduler do it), it is counted, its time clamped or 0
    assert await fold(pg) == 3
    row = await pg.fetchrow("SELECT sum(succeeded) AS n FROM task_stats WHERE caller = 'c'")
    assert row is not None and row["n"] == 3


async def test_retention_deletes_rollups_older_than_the_stats_retention_only(
    pg: asyncpg.Pool, settings: Settings
) -> None:
    from sieve.db.retention import Retention

    # Given rollup rows of an hour 40 days ago and of an hour 10 days ago
    now = datetime(2024, 6, 1, tzinfo=UTC)
    for age in (40, 10):
        hour = now - timedelta(days=age)
        await pg.execute(
            "INSERT INTO task_stats (caller, hour, device, type, verdict, succeeded) "
            "VALUES ('c', $1, 'D', 'TEXT', '', 1)",
            hour,
        )
        await pg.execute(
            "INSERT INTO task_stats_words (caller, hour, device, type, category, word, hits) "
            "VALUES ('c', $1, 'D', 'TEXT', 'g', 'w', 1)",
            hour,
        )
    # When retention runs with statistics kept 30 days, in batches of one
    report = await Retention(pg, settings.replace(stats_retention_days=30), batch=1).run(now)
    # Then only the old hour's rows are gone
    assert report.purged_stats == 2
    assert [r["hour"] for r in await pg.fetch("SELECT hour FROM task_stats")] == [now - timedelta(days=10)]
    assert await pg.fetchval("SELECT count(*) FROM task_stats_words") == 1


async def test_ocr_tasks_run_by_a_real_ocr_worker_are_counted_as_the_tables_say(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given a real OCR worker (the engine on CPU) and an image host on loopback that has one image and not another
    if importlib.util.find_spec("rapidocr_paddle") is None or importlib.util.find_spec("paddle") is None:
        pytest.skip("the `ocr` extra or the OCR models are not installed")
    font = require_cjk_font()
    images = [render(sample, font) for sample in SAMPLES[:4]]

    async def host(request: web.Request) -> web.StreamResponse:
        if request.match_info["name"] == "there.png":
            return web.Response(body=images[0], content_type="image/png")
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{name}", host)
    overrides = {"no_gpu_strategy": "cpu", "outbound_allow_private_nets": "127.0.0.0/8"}
    async with serving(app) as base, platform_with(settings, redis, pg, workers=0, **overrides) as p:
        await p.add_worker(worker_id="ocr-1", worker_task_types="OCR_IMAGE,TEXT")
        # When rendered images (with and without lexicon words), a fetched one, a missing one (404: FAILED) and
        # texts are submitted
        specs = [
            intake_pb2.TaskSpec(device_id=DEVICES[n % 2], type=types_pb2.TASK_TYPE_OCR_IMAGE, image=image)
            for n, image in enumerate(images)
        ]
        specs += [
            intake_pb2.TaskSpec(device_id=DEVICES[2], type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url=f"{base}/{name}")
            for name in ("there.png", "missing.png")
        ]
        specs += [text_spec(DEVICES[n % 3], TEXTS[n % 4]) for n in range(6)]
        reply = await p.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
        finals = [await wait_final(p.intake, item.task.task_id, timeout_s=120) for item in reply.items]
        assert [t.status for t in finals].count(types_pb2.TASK_STATUS_FAILED) == 1
        assert [t.status for t in finals].count(types_pb2.TASK_STATUS_SUCCEEDED) == len(specs) - 1

        # Then GetStats says what the tables say: counts per device, type and verdict, percentiles, words
        stats = await p.intake.GetStats(intake_pb2.GetStatsRequest(by_device=True, top=10))
        expected = await expected_from_tables(p.pg)
        assert counted(stats) == expected["buckets"]
        assert stats.totals.succeeded == len(specs) - 1 and stats.totals.failed == 1
        histogram = expected["histogram"]
        assert stats.totals.p50_processing_time_ms == pytest.approx(percentile_ms(histogram, 0.5), abs=1e-3)  # type: ignore[arg-type]
        assert stats.totals.p95_processing_time_ms == pytest.approx(percentile_ms(histogram, 0.95), abs=1e-3)  # type: ignore[arg-type]
        words = expected["words"]
        assert {(w.word, w.category, w.hits) for w in stats.top_words} == {
            (w, c, n)
            for (w, c), n in sorted(words.items(), key=lambda i: (-i[1], i[0]))[:10]  # type: ignore[attr-defined]
        }
        ocr_only = await p.intake.GetStats(intake_pb2.GetStatsRequest(type=types_pb2.TASK_TYPE_OCR_IMAGE))
        assert ocr_only.totals.succeeded == 5 and ocr_only.totals.failed == 1


async def test_the_fold_counts_each_final_task_once_however_late_its_transaction_commits(pg: asyncpg.Pool) -> None:
    store = TaskStore(pg)
    now = datetime.now(UTC)
    tasks = [
        NewTask(uuid7(), "AA:BB:CC:33:00:01", types_pb2.TASK_TYPE_TEXT, 3, "c", now, now + timedelta(hours=1), text="t")
        for _ in range(3)
    ]
    await store.insert(tasks)
    # Given one task cancelled in a transaction that stays open while another is cancelled and folded
    late = await pg.acquire()
    try:
        transaction = late.transaction()
        await transaction.start()
        await store.transition([tasks[0].task_id], "CANCELLED", "late", conn=late)
        await store.transition([tasks[1].task_id], "CANCELLED", "early")
        assert await fold(pg) == 1
        await transaction.commit()
    finally:
        await pg.release(late)
    # When the fold runs again, twice, concurrently, and once more
    counted = await asyncio.gather(fold(pg), fold(pg))
    assert sorted(counted) == [0, 1] and await fold(pg) == 0
    # and a dead letter requeued leaves its count
    await store.transition([tasks[2].task_id], "DEAD_LETTERED", "gave up")
    await store.revive([tasks[2].task_id], "requeued", 60)
    await fold(pg)
    # Then each is counted once
    row = await pg.fetchrow("SELECT sum(cancelled) AS c, sum(dead_lettered) AS d FROM task_stats WHERE caller = 'c'")
    assert (row["c"], row["d"]) == (2, 0)
