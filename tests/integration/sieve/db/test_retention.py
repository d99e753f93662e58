"""Retention against the real PostgreSQL and Redis: day partitions made ahead, an old day whose tasks are all final
dropped with its results, image bytes and idempotency keys, a day with an open task kept, rows outside every day
partition moved or deleted, existing rows carried over by the migration; and per-device Redis state gone once a
device has no work left, so that Redis holds O(1) keys after any number of devices came and went."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, time, timedelta

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from intake_svc.server import build as build_intake
from sieve import rpc
from sieve.db import apply_migrations, migration_files
from sieve.db.retention import Retention, day_bounds, partition_name
from sieve.db.tasks import NewTask, Outcome, TaskStore
from sieve.ids import datetime_ms, uuid7, uuid7_floor, uuid7_ms
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.integration.conftest import PNG
from tests.support.redis import prefix_keys

DEVICE = "AA:BB:CC:DD:EE:01"


def today() -> date:
    return datetime.now(UTC).date()


def noon(day: date) -> datetime:
    return datetime.combine(day, time(12), UTC)


def new_task(
    at: datetime | None = None, *, key: str | None = None, image: bytes | None = None, task_id: uuid.UUID | None = None
) -> NewTask:
    at = at or datetime.now(UTC)
    return NewTask(
        task_id or uuid7(datetime_ms(at)),
        DEVICE,
        types_pb2.TASK_TYPE_OCR_IMAGE if image else types_pb2.TASK_TYPE_TEXT,
        types_pb2.PRIORITY_NORMAL,
        "tests",
        at,
        at + timedelta(hours=1),
        text=None if image else "hello",
        image=image,
        idempotency_key=key,
    )


async def finish(store: TaskStore, *tasks: NewTask) -> None:
    ids = [t.task_id for t in tasks]
    started = await store.start("w1", [(i, 1, 1, datetime.now(UTC)) for i in ids])
    assert {s.task_id for s in started} == set(ids)
    assert await store.finish([Outcome(i, 1, "w1", "PASS", "[]", "hello") for i in ids]) == set(ids)


async def where(pg: asyncpg.Pool, task_id: uuid.UUID) -> str | None:
    return await pg.fetchval("SELECT tableoid::regclass::text FROM tasks WHERE id = $1", task_id)


async def tables(pg: asyncpg.Pool) -> set[str]:
    rows = await pg.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {r["tablename"] for r in rows}


@pytest.fixture
def retention_settings(settings: Settings) -> Settings:
    return settings.replace(retention_days=3, retention_ahead_days=2)


# --- ids ----------------------------------------------------------------------------------------------------------
def test_uuid7_carries_its_millisecond_and_sorts_by_it() -> None:
    ms = datetime_ms(datetime(2030, 5, 6, 7, 8, 9, 123000, UTC))
    ids = [uuid7(ms + i) for i in range(50)]
    assert [uuid7_ms(u) for u in ids] == [ms + i for i in range(50)]
    assert sorted(ids) == ids
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert len({uuid7(ms) for _ in range(1000)}) == 1000
    assert uuid7_floor(ms) <= uuid7(ms) < uuid7_floor(ms + 1)
    assert uuid7_ms(uuid.uuid4()) is None
    with pytest.raises(ValueError):
        uuid7(-1)


async def test_the_database_bound_is_the_python_bound(pg: asyncpg.Pool) -> None:
    ms = datetime_ms(datetime(2031, 1, 2, tzinfo=UTC))
    assert await pg.fetchval("SELECT uuid7_floor($1)", ms) == uuid7_floor(ms)


# --- partitions ahead ---------------------------------------------------------------------------------------------
async def test_the_migration_makes_today_and_the_days_ahead_and_new_tasks_land_in_their_day(pg: asyncpg.Pool) -> None:
    days = await Retention(pg, Settings()).day_partitions()
    assert {today() + timedelta(days=i) for i in range(3)} <= set(days)
    store = TaskStore(pg)
    task = new_task()
    await store.insert([task])
    assert await where(pg, task.task_id) == partition_name("tasks", today())


async def test_a_run_makes_the_days_ahead_and_the_days_it_missed(
    pg: asyncpg.Pool, retention_settings: Settings
) -> None:
    # Given a task of a day nothing ran on (its partition was not made: it waits in the default one)
    store = TaskStore(pg)
    missed = today() + timedelta(days=4)
    task = new_task(noon(missed))
    await store.insert([task])
    retention = Retention(pg, retention_settings.replace(retention_days=0))
    later = today() + timedelta(days=6)
    # When the job runs days later
    report = await retention.run(now=noon(later))
    # Then the days ahead of the new today got partitions, and of the days missed the one that has tasks
    assert report.created == [missed, later, later + timedelta(days=1), later + timedelta(days=2)]
    assert report.moved == 1 and await where(pg, task.task_id) == partition_name("tasks", missed)
    days = await retention.day_partitions()
    assert today() + timedelta(days=3) not in days and today() + timedelta(days=5) not in days
    # a second run has nothing to do
    assert (await retention.run(now=noon(later))).created == []
    # the same partitions of results exist, and both tables bound the day the same way
    for day in days:
        assert {partition_name("tasks", day), partition_name("results", day)} <= await tables(pg)
    lo, hi = day_bounds(later)
    bound = await pg.fetchval(
        "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c WHERE c.relname = $1",
        partition_name("results", later),
    )
    assert str(lo) in bound and str(hi) in bound


async def test_rows_of_a_day_without_partition_wait_in_the_default_one_and_move_into_their_day(
    pg: asyncpg.Pool, retention_settings: Settings
) -> None:
    # Given a task (with a result and a key) of a day that has no partition yet
    store = TaskStore(pg)
    later = today() + timedelta(days=5)
    task = new_task(noon(later), key="k-later")
    await store.insert([task])
    await finish(store, task)
    assert await where(pg, task.task_id) == "tasks_default"
    # When the day comes and its partitions are made
    report = await Retention(pg, retention_settings).run(now=noon(later) - timedelta(hours=11))
    # Then the task and its result moved there, and the default partitions are empty again
    assert report.moved == 1 and later in report.created
    assert await where(pg, task.task_id) == partition_name("tasks", later)
    assert await pg.fetchval(
        "SELECT tableoid::regclass::text FROM results WHERE task_id = $1", task.task_id
    ) == partition_name("results", later)
    assert await pg.fetchval("SELECT count(*) FROM tasks_default") == 0
    assert await pg.fetchval("SELECT count(*) FROM results_default") == 0
    # and the key still finds it
    again = await store.insert([new_task(noon(later), key="k-later")])
    assert (again[0].task_id, again[0].created) == (task.task_id, False)


# --- dropping old days --------------------------------------------------------------------------------------------
async def test_an_old_day_whose_tasks_are_final_goes_with_its_results_images_and_keys(
    settings: Settings, retention_settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    # Given today's tasks, finished: one with an image and a key, one with a key only, one plain
    store = TaskStore(pg)
    image_task, keyed, plain = new_task(image=PNG, key="k-image"), new_task(key="k-text"), new_task()
    await store.insert([image_task, keyed, plain])
    await finish(store, image_task, keyed, plain)
    assert await pg.fetchval("SELECT count(*) FROM idempotency_keys") == 2
    retention = Retention(pg, retention_settings)

    # When the retention runs while they are within retention: nothing goes
    report = await retention.run(now=datetime.now(UTC) + timedelta(days=2))
    assert report.dropped == [] and await store.get(plain.task_id) is not None

    # When it runs once the day ended more than retention_days ago
    report = await retention.run(now=noon(today() + timedelta(days=5)))

    # Then today's partitions are gone (dropped, not emptied), and with them results, image bytes and keys
    assert today() in report.dropped
    assert partition_name("tasks", today()) not in await tables(pg)
    assert partition_name("results", today()) not in await tables(pg)
    for t in (image_task, keyed, plain):
        assert await store.get(t.task_id) is None
    assert await pg.fetchval("SELECT count(*) FROM results") == 0
    assert await pg.fetchval("SELECT count(*) FROM tasks WHERE payload_bytes IS NOT NULL") == 0
    assert await pg.fetchval("SELECT count(*) FROM idempotency_keys") == 0
    assert report.purged_keys == 2

    # And GetTask of a purged task answers NOT_FOUND
    app = await build_intake(settings, Stores.of(redis=redis, pool=store.pool))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetTask(intake_pb2.GetTaskRequest(task_id=str(plain.task_id)))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(1)

    # And a key of a purged task is free again: it makes a new task
    [again] = await store.insert([new_task(key="k-text")])
    assert again.created and again.task_id != keyed.task_id


async def test_a_day_with_an_open_task_is_kept_until_it_ends(pg: asyncpg.Pool, retention_settings: Settings) -> None:
    # Given a day with finished tasks and one still pending (e.g. a dead letter an operator requeued)
    store = TaskStore(pg)
    done, still_open = new_task(), new_task(key="k-open")
    await store.insert([done, still_open])
    await finish(store, done)
    retention = Retention(pg, retention_settings)
    old = noon(today() + timedelta(days=5))

    # When the retention runs past the day's retention: the day is kept, nothing of it deleted
    report = await retention.run(now=old)
    assert today() in report.kept and today() not in report.dropped
    assert await store.get(done.task_id) is not None and await store.get(still_open.task_id) is not None
    assert await pg.fetchval("SELECT count(*) FROM idempotency_keys") == 1

    # When the open task ends: the next run drops the day
    await store.transition([still_open.task_id], "EXPIRED", "TTL passed while queued", error="expired")
    report = await retention.run(now=old)
    assert today() in report.dropped
    assert await store.get(still_open.task_id) is None
    assert await pg.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_a_day_whose_task_changed_within_retention_is_kept(
    pg: asyncpg.Pool, retention_settings: Settings
) -> None:
    # Given a day whose task finished long after the day itself (it was requeued from the dead letters)
    store = TaskStore(pg)
    task = new_task()
    await store.insert([task])
    await finish(store, task)
    later = datetime.now(UTC) + timedelta(days=6)
    await pg.execute("UPDATE tasks SET updated_at = $2 WHERE id = $1", task.task_id, later)
    retention = Retention(pg, retention_settings)

    # Then the day stays until retention_days after that change
    assert today() in (await retention.run(now=later + timedelta(days=2))).kept
    assert await store.get(task.task_id) is not None
    assert today() in (await retention.run(now=later + timedelta(days=3, minutes=1))).dropped


async def test_retention_days_zero_keeps_everything(pg: asyncpg.Pool, retention_settings: Settings) -> None:
    store = TaskStore(pg)
    task = new_task()
    await store.insert([task])
    await finish(store, task)
    report = await Retention(pg, retention_settings.replace(retention_days=0)).run(
        now=datetime.now(UTC) + timedelta(days=400)
    )
    assert report.dropped == [] and report.created
    assert await store.get(task.task_id) is not None


# --- the default partition ------------------------------------------------------------------------------------------
async def test_old_final_rows_of_the_default_partition_are_deleted_in_batches(
    pg: asyncpg.Pool, retention_settings: Settings
) -> None:
    # Given tasks with random (v4) ids, as recorded before ids were time-ordered: most are final, one is open
    store = TaskStore(pg)
    tasks = [new_task(task_id=uuid.uuid4(), key=f"legacy-{i}") for i in range(23)]
    await store.insert(tasks)
    # (v4 ids may fall in a day partition now and then: only those in the default one are this test's)
    legacy = [t for t in tasks if await where(pg, t.task_id) == "tasks_default"]
    assert len(legacy) >= 20
    await finish(store, *legacy[1:])
    retention = Retention(pg, retention_settings, batch=4)

    # When the retention runs past their retention
    report = await retention.run(now=datetime.now(UTC) + timedelta(days=4))

    # Then the final ones are gone with their results and keys; the open one stays, with its key
    assert report.purged_default == len(legacy) - 1
    assert await pg.fetchval("SELECT count(*) FROM tasks_default") == 1
    assert await pg.fetchval("SELECT count(*) FROM results_default") == 0
    assert await store.get(legacy[0].task_id) is not None
    left = {r["key"] for r in await pg.fetch("SELECT key FROM idempotency_keys")}
    assert legacy[0].idempotency_key in left
    assert not {t.idempotency_key for t in legacy[1:]} & left


async def test_one_run_at_a_time(pg: asyncpg.Pool, retention_settings: Settings) -> None:
    retention = Retention(pg, retention_settings)
    async with pg.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", retention._lock_key)
        try:
            assert (await retention.run(now=noon(today() + timedelta(days=9)))).ran is False
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", retention._lock_key)
    assert (await retention.run(now=noon(today() + timedelta(days=9)))).ran is True


# --- the migration ---------------------------------------------------------------------------------------------------
async def test_the_migration_carries_existing_rows_keys_and_results_over(settings: Settings) -> None:
    # Given a schema at migration 0007 holding tasks with random ids, keys and results
    before = [p for p in migration_files() if p.stem < "0008"]
    assert before and before[-1].stem.startswith("0007")
    schema = settings.database_schema
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute(
            "CREATE TABLE schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        texts = await asyncio.to_thread(lambda: [p.read_text() for p in before])
        for path, text in zip(before, texts, strict=True):
            await conn.execute(text)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", path.stem)
        ids = [uuid.uuid4() for _ in range(30)]
        await conn.execute(
            """
            INSERT INTO tasks (id, device, type, priority, status, caller, idempotency_key, payload_text,
                               created_at, updated_at, expires_at, enqueued_at)
            SELECT id, $2, 'TEXT', 3, CASE WHEN n % 2 = 0 THEN 'SUCCEEDED' ELSE 'PENDING' END, 'tests',
                   CASE WHEN n % 3 = 0 THEN 'key-' || n END, 'hello', now(), now(), now() + interval '1 hour', now()
            FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)
            """,
            ids,
            DEVICE,
        )
        await conn.execute(
            "INSERT INTO results (task_id, verdict, hits, text, worker_id, attempt) "
            "SELECT id, 'PASS', '[]', 'hello', 'w1', 1 FROM tasks WHERE status = 'SUCCEEDED'"
        )
        await conn.close()

        # When the services start (migrations applied)
        assert "0008_retention_partitions" in await apply_migrations(settings)

        # Then every row is there, reachable by id, and the keys still find their tasks
        pool = await asyncpg.create_pool(
            settings.database_url, min_size=1, max_size=2, server_settings={"search_path": schema}
        )
        try:
            assert await pool.fetchval("SELECT count(*) FROM tasks") == 30
            assert await pool.fetchval("SELECT count(*) FROM results") == 15
            assert await pool.fetchval("SELECT count(*) FROM idempotency_keys") == 10
            assert await pool.fetchval("SELECT relkind FROM pg_class WHERE oid = 'tasks'::regclass") == b"p"
            store = TaskStore(pool)
            row, result = await store.get(ids[1])  # the second one: SUCCEEDED, with a result
            assert row["status"] == "SUCCEEDED" and result["verdict"] == "PASS"
            [repeat] = await store.insert([new_task(key="key-3")])
            assert (repeat.task_id, repeat.created) == (ids[2], False)
            [fresh] = await store.insert([new_task(key="key-new")])
            assert fresh.created and await where(pool, fresh.task_id) == partition_name("tasks", today())
        finally:
            await pool.close()
    finally:
        conn = await asyncpg.connect(settings.database_url)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


async def test_the_scheduler_housekeeping_makes_the_partitions_ahead(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    from tests.integration.conftest import platform_with

    async with platform_with(settings, redis, pg, retention_ahead_days=4, retention_check_interval_s=0.2):
        retention = Retention(pg, settings)
        deadline = asyncio.get_running_loop().time() + 20
        while today() + timedelta(days=4) not in await retention.day_partitions():
            assert asyncio.get_running_loop().time() < deadline, "no partition made ahead"
            await asyncio.sleep(0.1)


# --- Redis: per-device state lasts only while the device has work ----------------------------------------------------
async def run_devices(store: QueueStore, first: int, count: int, *, nack_first: bool = False) -> None:
    """`count` devices submit one task each (an enqueue), and each is served (a pop) and finished (an ack);
    with nack_first each task is first put back with a retry delay and promoted again, then served."""
    now = now_ms()
    macs = [
        f"02:00:{(i >> 24) & 0xFF:02X}:{(i >> 16) & 0xFF:02X}:{(i >> 8) & 0xFF:02X}:{i & 0xFF:02X}"
        for i in range(first, first + count)
    ]
    for chunk in range(0, count, 500):
        group = macs[chunk : chunk + 500]
        await store.enqueue_many(
            {mac: [Entry(f"t-{mac}", 1, 3, int(now), int(now) + 3_600_000, caller="tests")] for mac in group}, now=now
        )
        popped = {mac: await store.pop(mac, "tok", 1, release=True, now=now) for mac in group}
        if nack_first:
            for mac, p in popped.items():
                await store.requeue(
                    mac,
                    [(e.task_id, e.attempt) for e in p.taken],
                    count_attempt=False,
                    reason="later",
                    retry_at_ms=now + 1000,
                    now=now,
                )
            assert await store.promote_due(now=now + 1000, limit=len(group)) == len(group)
            popped = {mac: await store.pop(mac, "tok", 1, release=True, now=now + 1000) for mac in group}
        leases = [(e.task_id, e.attempt) for p in popped.values() for e in p.taken]
        assert len(leases) == len(group)
        assert all(await store.ack(leases))


async def test_redis_keeps_no_state_of_devices_whose_work_is_done(settings: Settings, redis: Redis) -> None:
    store = QueueStore(redis, settings)
    # Given 200 devices that each submitted one task, all served and finished
    await run_devices(store, 0, 200)
    few = await prefix_keys(redis, settings.redis_prefix, count=5000)
    # When 2 000 more devices do the same, some of them by way of a retry delay
    await run_devices(store, 200, 1800)
    await run_devices(store, 2000, 200, nack_first=True)
    # Then Redis holds as many keys as before: nothing per device (meta, queues, locks, sets all gone)
    many = await prefix_keys(redis, settings.redis_prefix, count=5000)
    assert len(many) == len(few) <= 5, sorted(many)
    assert not [k for k in many if ":meta:" in k or ":q:" in k or ":lock:" in k]
    assert await store.pending() == 0


async def test_a_device_keeps_its_state_while_it_has_work_out(settings: Settings, redis: Redis) -> None:
    store = QueueStore(redis, settings)
    mac, now = DEVICE, int(now_ms())
    await store.enqueue(mac, [Entry(f"t{i}", 1, 3, now, now + 3_600_000) for i in range(2)], now=now)
    # one task leased, one delayed: the device is idle but keeps its meta (the wait of its next turn, its rate)
    popped = await store.pop(mac, "tok", 2, release=True, now=now)
    await store.requeue(
        mac,
        [(popped.taken[1].task_id, popped.taken[1].attempt)],
        count_attempt=True,
        reason="nack",
        retry_at_ms=now + 5000,
        now=now,
    )
    meta = await store.device_meta(mac)
    assert (meta["state"], meta["outstanding"], meta["last_served_ms"]) == ("idle", "2", str(now))
    # the lease finishes: one is still out (delayed)
    assert await store.ack([(popped.taken[0].task_id, popped.taken[0].attempt)]) == [True]
    assert (await store.device_meta(mac))["outstanding"] == "1"
    # the delayed one comes back: queued again, scheduled from when the device was last served
    assert await store.promote_due(now=now + 5000) == 1
    meta = await store.device_meta(mac)
    assert (meta["state"], meta["backlog"], meta.get("outstanding")) == ("ready", "1", None)
    assert meta["since_ms"] == str(now)
    # and once it is served and finished, nothing of the device is left
    popped = await store.pop(mac, "tok", 1, release=True, now=now + 6000)
    assert await store.ack([(e.task_id, e.attempt) for e in popped.taken], device_of={"t1": mac}) == [True]
    assert await store.device_meta(mac) == {}


async def test_a_device_backing_off_keeps_its_state_until_it_resumes(settings: Settings, redis: Redis) -> None:
    store = QueueStore(redis, settings)
    mac, now = DEVICE, int(now_ms())
    await store.enqueue(mac, [Entry("t0", 1, 3, now, now + 3_600_000)], now=now)
    popped = await store.pop(mac, "tok", 1, now=now)
    deferred = await store.defer(mac, "tok", [popped.taken[0].task_id], "no worker", now=now)
    # its only task is cancelled while it backs off: the backoff (and its exponent) is kept until it ends
    assert await store.cancel(mac, "t0", now=now + 1)
    meta = await store.device_meta(mac)
    assert (meta["state"], meta["defer_count"]) == ("backoff", "1")
    assert await redis.zscore(store.keys.backoff, mac) == deferred.unschedulable_until_ms
    # it resumes with nothing to do: forgotten
    assert await store.resume_due(now=deferred.unschedulable_until_ms) == [mac]
    assert await store.device_meta(mac) == {}
    assert await redis.zscore(store.keys.backoff, mac) is None


async def test_through_the_platform_no_device_state_is_left_once_tasks_finish(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    from tests.integration.conftest import platform_with, text_spec, wait_final

    async with platform_with(settings, redis, pg, workers=1) as p:
        macs = [f"02:00:00:00:01:{i:02X}" for i in range(40)]
        reply = await p.intake.SubmitBatch(
            intake_pb2.SubmitBatchRequest(tasks=[text_spec(mac, f"hello {i}") for i, mac in enumerate(macs)])
        )
        ids = [item.task.task_id for item in reply.items]
        assert len(ids) == len(macs)
        for task_id in ids:
            assert (await wait_final(p.intake, task_id, timeout_s=60)).status == types_pb2.TASK_STATUS_SUCCEEDED
        # acks follow the results: wait until the leases are settled
        deadline = asyncio.get_running_loop().time() + 20
        while await redis.exists(p.queues.keys.lease_data):
            assert asyncio.get_running_loop().time() < deadline, "leases never settled"
            await asyncio.sleep(0.05)
        left = [
            k
            for k in await prefix_keys(redis, settings.redis_prefix, count=5000)
            if ":meta:" in k or ":q:" in k or ":lock:" in k
        ]
        assert left == []


# --- device reports -----------------------------------------------------------------------------------------------
async def test_device_reports_older_than_retention_are_deleted_in_batches_and_newer_ones_kept(
    pg: asyncpg.Pool, retention_settings: Settings
) -> None:
    # Given 25 reports received 4 days ago and 3 received today (retention 3 days)
    now = datetime.now(UTC)
    rows = [(f"r-{n}", now - timedelta(days=4, minutes=n)) for n in range(25)] + [
        (f"new-{n}", now - timedelta(minutes=n)) for n in range(3)
    ]
    await pg.executemany(
        "INSERT INTO device_reports (caller, device, report_id, detected_at, received_at, subject, content, verdict,"
        " hits, fingerprint) VALUES ('c', 'AA:BB:CC:00:00:01', $1, $2, $2, 'text', 'x', 'PASS', '[]', '\\x00')",
        rows,
    )
    # When the retention runs, in batches of 10
    report = await Retention(pg, retention_settings, batch=10).run(now=now)
    # Then the old ones are gone and today's stay
    assert report.purged_reports == 25
    left = await pg.fetch("SELECT report_id FROM device_reports ORDER BY report_id")
    assert [r["report_id"] for r in left] == ["new-0", "new-1", "new-2"]


async def test_external_jobs_that_ended_before_retention_are_deleted_and_open_or_recent_ones_kept(
    pg: asyncpg.Pool, retention_settings: Settings
) -> None:
    # Given external job stages: 12 that ended 4 days ago (completed or failed), 2 still submitted and 1 succeeded
    # from 4 days ago (an engine may resume them), and 1 completed today (retention 3 days)
    now = datetime.now(UTC)
    old = now - timedelta(days=4)
    rows = [(uuid.uuid4(), "completed" if n % 2 else "failed", old) for n in range(12)]
    rows += [(uuid.uuid4(), "submitted", old), (uuid.uuid4(), "submitted", old), (uuid.uuid4(), "succeeded", old)]
    rows += [(uuid.uuid4(), "completed", now)]
    await pg.executemany(
        "INSERT INTO external_jobs (task_id, stage, stage_index, provider, caller, pool, holder, attempt, state,"
        " created_at, finished_at) VALUES ($1, 'main', 0, 'p', 'c', 'p', $2, 1, $3, $4::timestamptz,"
        " CASE WHEN $3 IN ('completed', 'failed') THEN $4::timestamptz END)",
        [(task_id, f"{task_id}:main:1", state, at) for task_id, state, at in rows],
    )
    # When the retention runs, in batches of 5
    report = await Retention(pg, retention_settings, batch=5).run(now=now)
    # Then the stages that ended before the cutoff are gone, the open ones and today's stay
    assert report.purged_external == 12
    left = await pg.fetch("SELECT state FROM external_jobs ORDER BY state")
    assert [r["state"] for r in left] == ["completed", "submitted", "submitted", "succeeded"]
