"""Reconciliation against the real Redis and PostgreSQL: every open task of PostgreSQL ends up in exactly one place
in Redis (queue, lease, delayed set). A task recorded but never queued, a device's deleted queues and meta, a lost
lease, a lease without a deadline, a dead-lettering or an expiry whose PostgreSQL write was lost are each found
and mended, with the counters exact afterwards; tasks that are where they should be (queued, leased, delayed,
moving between them, or too young) are left alone; two passes at once queue a task once; the page query uses
the partial index of open tasks."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
from redis.asyncio import Redis

from scheduler_svc.reconcile import PassReport, Reconciler
from sieve.db.tasks import RECONCILE_PAGE_SETTINGS, RECONCILE_PAGE_SQL, NewTask, Outcome, TaskStore
from sieve.ids import uuid7_at
from sieve.redis.keys import PRIORITIES, Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import platform_with, text_spec, wait_final

A, B = "AA:BB:CC:DD:EE:01", "AA:BB:CC:DD:EE:02"


def quick(settings: Settings, **overrides: object) -> Settings:
    """Reconciliation that looks at tasks unchanged for 1 s (the tests age their rows by an hour)."""
    return settings.replace(reconcile_grace_s=1.0, **overrides)


def new_task(device: str = A, *, age_s: float = 3600, text: str = "hello") -> NewTask:
    created = datetime.now(UTC) - timedelta(seconds=age_s)
    return NewTask(
        uuid7_at(created),
        device,
        types_pb2.TASK_TYPE_TEXT,
        types_pb2.PRIORITY_NORMAL,
        "tests",
        created,
        created + timedelta(hours=2),
        text=text,
    )


async def age(pg: asyncpg.Pool, seconds: float = 3600) -> None:
    """Makes every row look unchanged for `seconds` (past any grace period)."""
    await pg.execute("UPDATE tasks SET updated_at = updated_at - make_interval(secs => $1)", seconds)


async def submit(p: object, device: str, count: int) -> list[str]:
    reply = await p.intake.SubmitBatch(
        intake_pb2.SubmitBatchRequest(  # type: ignore[attr-defined]
            tasks=[text_spec(device.replace(":", "-"), f"task {i}") for i in range(count)]
        )
    )
    return [item.task.task_id for item in reply.items]


async def group_of(redis: Redis, keys: Keys, mac: str) -> str:
    """The caller group of a device (its meta's; "-" once its meta is gone)."""
    return await redis.hget(keys.meta(mac), "group") or "-"


async def schedule_score(redis: Redis, keys: Keys, mac: str, prio: int = types_pb2.PRIORITY_NORMAL) -> float | None:
    """The device's score in the schedule set of `prio` (weight 1) of whichever caller group holds it."""
    async for key in redis.scan_iter(match=f"{keys.schedule_base(prio, 1)}:*", count=1000):
        score = await redis.zscore(key, mac)
        if score is not None:
            return float(score)
    return None


async def history_details(pg: asyncpg.Pool, task_id: str) -> list[str]:
    history = await pg.fetchval("SELECT history FROM tasks WHERE id = $1::uuid", task_id)
    return [h["detail"] for h in history]


async def test_a_task_recorded_but_never_queued_is_queued_again_with_a_fenced_attempt(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    s = quick(settings)
    tasks, queues = TaskStore(pg), QueueStore(redis, s)
    # Given rows an intake wrote before it died (never enqueued), one of them started once before (lease 3)
    lost = [new_task(), new_task(), new_task(B)]
    await tasks.insert(lost)
    await pg.execute("UPDATE tasks SET lease = 3, attempts = 2 WHERE id = $1", lost[1].task_id)
    await age(pg)
    # When a pass runs
    report = await Reconciler(queues, tasks).run_pass()
    # Then each is queued on its device once, its attempt the lease number plus the fence step, counted exactly
    assert report.found["requeued"] == 3 and report.checked == 3
    queued_a = {e.task_id: e for e in await queues.queued(A)}
    assert set(queued_a) == {str(lost[0].task_id), str(lost[1].task_id)}
    assert [e.task_id for e in await queues.queued(B)] == [str(lost[2].task_id)]
    assert queued_a[str(lost[0].task_id)].attempt == s.reconcile_fence_step
    assert queued_a[str(lost[1].task_id)].attempt == 3 + s.reconcile_fence_step
    assert queued_a[str(lost[1].task_id)].failures == 1
    assert queued_a[str(lost[0].task_id)].caller == "tests"
    assert await queues.pending() == 3
    assert (await queues.device_meta(A))["backlog"] == "2"
    assert any("re-queued by reconciliation" in d for d in await history_details(pg, str(lost[1].task_id)))
    # And a second pass finds everything in its place
    again = await Reconciler(queues, tasks).run_pass()
    assert not again.wrong and again.checked == 3


async def test_a_task_recorded_but_never_queued_is_finished_by_a_worker_through_the_schedulers_own_loop(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, workers=1, reconcile_interval_s=0.3, reconcile_grace_s=0.5) as p:
        # Given a row written by an intake that died before enqueueing it (no queue holds it)
        task = new_task(age_s=0)
        await TaskStore(pg).insert([task])
        # Then the scheduler's reconciler queues it once its grace period is over, and the worker finishes it
        final = await wait_final(p.intake, str(task.task_id), timeout_s=20)
        assert final.status == types_pb2.TASK_STATUS_SUCCEEDED
        assert p.scheduler.housekeeping.reconciler.totals["requeued"] == 1
        assert await p.queues.pending() == 0


async def test_tasks_in_a_queue_a_lease_or_the_delayed_set_and_young_rows_are_left_alone(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        tasks, queues = TaskStore(pg), p.queues
        ids = await submit(p, A, 12)
        # Given four tasks leased, four waiting out a retry delay, four queued
        popped = await queues.pop(A, "tok", 8, release=True)
        await queues.requeue(
            A,
            [(e.task_id, e.attempt) for e in popped.taken[4:]],
            count_attempt=False,
            reason="later",
            retry_at_ms=datetime.now(UTC).timestamp() * 1000 + 600_000,
        )
        await age(pg)
        # and one row written just now that no queue holds yet (a Submit between its row and its enqueue)
        young = new_task(B, age_s=0)
        await tasks.insert([young])
        # When a pass runs
        report = await Reconciler(queues, tasks).run_pass()
        # Then nothing is wrong and nothing moved
        assert not report.wrong, report
        assert report.checked == 12
        assert len(await queues.queued(A)) == 4 and await queues.queued(B) == []
        assert await redis.zcard(queues.keys.leases) == 4 and await redis.zcard(queues.keys.delayed) == 4
        assert await queues.pending() == 4
        assert {e.task_id for e in popped.taken} <= set(ids)


async def test_a_task_that_moved_into_the_delayed_set_after_the_snapshot_is_not_queued_twice(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        tasks, queues = TaskStore(pg), p.queues
        ids = await submit(p, A, 3)
        popped = await queues.pop(A, "tok", 1, release=True)
        # Given a task that went to the delayed set after the pass read its snapshot of it (an empty one)
        await queues.requeue(
            A,
            [(popped.taken[0].task_id, popped.taken[0].attempt)],
            count_attempt=False,
            reason="later",
            retry_at_ms=datetime.now(UTC).timestamp() * 1000 + 600_000,
        )
        await age(pg)
        reconciler = Reconciler(queues, tasks)
        rows = await tasks.reconcile_page(None, 100, 1.0)
        report = PassReport()
        generation = await queues.generation()
        assert generation is not None
        # When a page is looked at with that stale snapshot
        await reconciler._page(rows, generation, set(), report)
        # Then the exact look found it in the delayed set: nothing is queued again
        assert report.found["requeued"] == 0
        assert len(await queues.queued(A)) == 2 and await redis.zcard(queues.keys.delayed) == 1
        assert len(ids) == 3


async def test_a_devices_deleted_queues_and_meta_are_requeued_and_every_counter_is_exact_again(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        tasks, queues = TaskStore(pg), p.queues
        lost = await submit(p, A, 30)
        kept = await submit(p, B, 10)
        await age(pg)
        assert await queues.pending() == 40
        # Given device A's queue lists and meta deleted behind Sieve's back (its schedule entry stays: a ghost)
        deleted = await redis.delete(queues.keys.meta(A), *(queues.keys.queue(A, prio) for prio in PRIORITIES))
        assert deleted == 2  # the meta and its one non-empty queue
        assert await schedule_score(redis, queues.keys, A) is not None
        # When a pass runs
        report = await Reconciler(queues, tasks).run_pass()
        # Then exactly the 30 lost tasks are queued again, and nothing else
        assert report.found["requeued"] == 30, report
        assert sorted(e.task_id for e in await queues.queued(A)) == sorted(lost)
        assert [e.task_id for e in await queues.queued(B)] == kept
        # and the counters are exact: pending recounted (it still counted the deleted entries), A's backlog
        assert await queues.pending() == 40
        assert report.pending == (70, 40)
        meta = await queues.device_meta(A)
        assert meta["backlog"] == "30" and meta["state"] == "ready"
        # And a worker finishes all 40
        await p.add_worker(worker_id="w-after")
        for task_id in lost + kept:
            assert (await wait_final(p.intake, task_id)).status == types_pb2.TASK_STATUS_SUCCEEDED
        assert await queues.pending() == 0
        assert await pg.fetchval("SELECT count(*) FROM results") == 40


async def test_a_device_left_in_a_schedule_set_without_its_meta_is_taken_out(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        queues = p.queues
        await submit(p, A, 2)
        popped = await queues.pop(A, "tok", 2, release=True)
        # Given a device with leased tasks only, whose meta is deleted while it still sat in a schedule set
        group = await group_of(redis, queues.keys, A)
        await redis.delete(queues.keys.meta(A))
        await redis.zadd(queues.keys.schedule(types_pb2.PRIORITY_NORMAL, 1, group), {A: 1})
        await redis.zadd(queues.keys.group_ready(group), {A: 1})
        await redis.zadd(queues.keys.callers(1), {group: 1})
        assert (await queues.rank()).mac == A  # the dispatcher would claim it in vain
        # When a pass runs (no open task of A is past the grace period: only the schedule sets show it)
        report = await Reconciler(queues, TaskStore(pg)).run_pass()
        # Then it is out of the schedule sets, idle
        assert report.found["device"] == 1, report
        assert (await queues.rank()).mac is None
        assert (await queues.device_meta(A)).get("state", "idle") == "idle"  # (a meta with nothing in it goes)
        assert len(popped.taken) == 2


async def test_device_keys_that_disagree_with_the_queues_are_mended_and_the_device_served_again(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    devices = [f"AA:BB:CC:DD:EF:{i:02X}" for i in range(5)]
    async with platform_with(quick(settings), redis, pg) as p:
        queues = p.queues
        for mac in devices:
            await submit(p, mac, 3)
        await age(pg)
        k = queues.keys
        # Given one device each: a backlog count that is off, idle with work, backing off with no backoff entry,
        # serving with no lock and no serving entry, out of the active set and of its schedule set
        await redis.hset(k.meta(devices[0]), "backlog", 99)
        await redis.hset(k.meta(devices[1]), mapping={"state": "idle", "class": 0})
        await redis.zrem(
            k.schedule(types_pb2.PRIORITY_NORMAL, 1, await group_of(redis, k, devices[1])),
            devices[1],
            devices[2],
            devices[3],
            devices[4],
        )
        await redis.hset(k.meta(devices[2]), mapping={"state": "backoff", "class": 0})
        await redis.hset(k.meta(devices[3]), mapping={"state": "serving", "class": 0})
        await redis.srem(k.devices, devices[4])
        await redis.hset(k.meta(devices[4]), mapping={"state": "ready", "class": types_pb2.PRIORITY_NORMAL})
        await redis.set(k.pending, 7)
        # When a pass runs
        report = await Reconciler(queues, TaskStore(pg)).run_pass()
        # Then each is mended, nothing is queued twice, and the pending counter is recounted
        assert report.found["device"] == 5 and report.found["requeued"] == 0, report
        assert report.pending == (7, 15)
        for mac in devices:
            meta = await queues.device_meta(mac)
            assert (meta["backlog"], meta["state"]) == ("3", "ready"), (mac, meta)
            assert await schedule_score(redis, k, mac) is not None
            assert await redis.sismember(k.devices, mac)
        # and a second pass finds nothing wrong; a worker finishes every task
        assert not (await Reconciler(queues, TaskStore(pg)).run_pass()).wrong
        await p.add_worker(worker_id="w-after")
        for _ in range(200):
            if await pg.fetchval("SELECT count(*) FROM results") == 15:
                break
            await asyncio.sleep(0.05)
        assert await pg.fetchval("SELECT count(*) FROM results") == 15
        assert await queues.pending() == 0


async def test_a_lost_lease_is_requeued_above_every_hand_out_and_the_old_holders_result_is_refused(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        tasks, queues = TaskStore(pg), p.queues
        [task_id] = await submit(p, A, 1)
        # Given a task handed out and started by a worker (lease 1) whose lease Redis then lost
        [first] = (await queues.pop(A, "tok", 1, release=True)).taken
        assert first.attempt == 1
        await tasks.start("old-worker", [(uuid.UUID(task_id), 1, 1, datetime.now(UTC))])
        await redis.hdel(queues.keys.lease_data, task_id)
        await redis.zrem(queues.keys.leases, task_id)
        await age(pg)
        # When a pass runs
        report = await Reconciler(queues, tasks).run_pass()
        assert report.found["requeued"] == 1
        # Then its next hand-out is fenced above the lost one, and starts
        [second] = (await queues.pop(A, "tok", 1, release=True)).taken
        assert second.attempt == 1 + settings.reconcile_fence_step + 1
        started = await tasks.start("new-worker", [(uuid.UUID(task_id), second.attempt, 1, datetime.now(UTC))])
        assert [s.attempt for s in started] == [second.attempt]
        # And the old holder's late result is refused; the new one is stored
        assert await tasks.finish([Outcome(uuid.UUID(task_id), 1, "old-worker", "PASS", "[]", "x")]) == set()
        assert await tasks.finish([Outcome(uuid.UUID(task_id), second.attempt, "new-worker", "PASS", "[]", "x")]) == {
            uuid.UUID(task_id)
        }
        assert await queues.ack([(task_id, second.attempt)]) == [True]


async def test_a_lease_without_a_deadline_gets_one(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        queues = p.queues
        [task_id] = await submit(p, A, 1)
        await queues.pop(A, "tok", 1, release=True)
        # Given a lease whose deadline was lost (it would never be taken back)
        await redis.zrem(queues.keys.leases, task_id)
        await age(pg)
        report = await Reconciler(queues, TaskStore(pg)).run_pass()
        # Then it has one again (one lease TTL from now), and the task was not queued a second time
        assert report.found["lease_deadline"] == 1 and report.found["requeued"] == 0
        deadline = await redis.zscore(queues.keys.leases, task_id)
        assert deadline is not None and deadline > datetime.now(UTC).timestamp() * 1000
        assert await queues.queued(A) == []


async def test_a_dead_lettering_or_an_expiry_whose_postgresql_write_was_lost_is_recorded(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(quick(settings), redis, pg) as p:
        tasks, queues = TaskStore(pg), p.queues
        dead_id, expiring_id = await submit(p, A, 2)
        await age(pg)
        # Given a task Redis dead-lettered whose DEAD_LETTERED write never reached PostgreSQL
        popped = (await queues.pop(A, "tok", 1, release=True)).taken
        assert [e.task_id for e in popped] == [dead_id]
        result = await queues.requeue(
            A, [(dead_id, popped[0].attempt)], count_attempt=True, reason="it broke", max_attempts=0
        )
        assert len(result.dead_letters) == 1
        # and a task dropped from its queue after its TTL passed, whose EXPIRED write was lost too
        await pg.execute("UPDATE tasks SET expires_at = now() - interval '1 minute' WHERE id = $1::uuid", expiring_id)
        assert await queues.remove_queued(A, expiring_id) is not None
        # When a pass runs
        report = await Reconciler(queues, tasks).run_pass()
        # Then both are recorded as Redis decided, and neither is queued again
        assert report.found["dead_lettered"] == 1 and report.found["expired"] == 1, report
        assert report.found["requeued"] == 0
        statuses = dict(await pg.fetch("SELECT id::text, status FROM tasks"))
        assert statuses == {dead_id: "DEAD_LETTERED", expiring_id: "EXPIRED"}
        assert await queues.queued(A) == []


async def test_a_dead_letter_older_than_the_rows_last_change_does_not_stop_a_requeue(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    s = quick(settings)
    tasks, queues = TaskStore(pg), QueueStore(redis, s)
    # Given a task dead-lettered long ago, requeued by an operator since (PENDING, changed after the dead letter),
    # whose enqueue was lost, while its old dead-letter record is still in the list
    task = new_task()
    await tasks.insert([task])
    await pg.execute("UPDATE tasks SET updated_at = now() - interval '10 minutes'")
    await redis.lpush(
        queues.keys.dead_letters,
        json.dumps(
            {
                "task_id": str(task.task_id),
                "device": A,
                "error": "old",
                "dead_ms": int((datetime.now(UTC) - timedelta(hours=1)).timestamp() * 1000),
            }
        ),
    )
    report = await Reconciler(queues, tasks).run_pass()
    # Then it is queued again, not dead-lettered
    assert report.found["requeued"] == 1 and report.found["dead_lettered"] == 0
    assert await pg.fetchval("SELECT status FROM tasks") == "PENDING"


async def test_two_passes_at_once_queue_each_lost_task_once(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    s = quick(settings)
    tasks, queues = TaskStore(pg), QueueStore(redis, s)
    lost = [new_task(f"AA:BB:CC:DD:{i // 20:02X}:{i % 20:02X}") for i in range(200)]
    await tasks.insert(lost)
    await age(pg)
    # When two replicas pass at the same moment (page by page, interleaved)
    first, second = await asyncio.gather(
        Reconciler(queues, tasks).run_pass(),
        Reconciler(QueueStore(redis, s.replace(reconcile_page_rows=7)), tasks).run_pass(),
    )
    # Then every lost task is queued exactly once
    assert first.found["requeued"] + second.found["requeued"] == 200
    assert await queues.pending() == 200
    queued = [e.task_id for t in lost for e in await queues.queued(t.device)]
    assert len(queued) == len(set(queued)) == 200


async def test_one_pass_per_interval_whatever_the_number_of_replicas(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    s = quick(settings, reconcile_interval_s=30.0)
    tasks = TaskStore(pg)
    replicas = [Reconciler(QueueStore(redis, s), tasks) for _ in range(3)]
    reports = await asyncio.gather(*(r.maybe_pass() for r in replicas))
    assert sum(r is not None for r in reports) == 1
    assert [r.passes for r in replicas].count(1) == 1
    assert await redis.pttl(QueueStore(redis, s).keys.reconcile_lock) > 20_000


async def test_a_pass_waits_for_a_rebuild_and_stops_when_redis_is_rebuilt_under_it(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    s = quick(settings)
    tasks, queues = TaskStore(pg), QueueStore(redis, s)
    await tasks.insert([new_task()])
    await age(pg)
    # Given Redis without a generation (lost its memory, not rebuilt yet): nothing is done
    await redis.delete(queues.keys.generation)
    report = await Reconciler(queues, tasks).run_pass()
    assert report.stopped and report.checked == 0
    # Given a rebuild that happened after the pass began: the pass does not queue anything of its own
    await redis.set(queues.keys.generation, "new")
    rows = await tasks.reconcile_page(None, 10, 1.0)
    reconciler = Reconciler(queues, tasks)
    fresh = PassReport()
    await reconciler._page(rows, "old", set(), fresh)
    assert fresh.stopped == "Redis was rebuilt during the pass" and fresh.found["requeued"] == 0
    assert await queues.queued(A) == []
    # and while the rebuild lock is held by a rebuild, the re-queue waits for a later pass
    await redis.set(queues.keys.rebuild_lock, "rebuilding", px=5000)
    later = PassReport()
    await reconciler._page(rows, "new", set(), later)
    assert later.stopped == "Redis is being rebuilt" and await queues.queued(A) == []


async def test_the_page_query_reads_the_partial_index_of_open_tasks(settings: Settings, pg: asyncpg.Pool) -> None:
    # Given 15 000 finished tasks and 5 000 open ones over 50 devices, and a page smaller than the open ones
    await pg.execute(
        """
        INSERT INTO tasks (id, device, type, priority, status, caller, created_at, updated_at, expires_at,
                           enqueued_at, payload_text)
        SELECT gen_random_uuid(), 'AA:BB:CC:DD:EE:' || lpad(to_hex(i % 50), 2, '0'), 'TEXT', 3,
               CASE WHEN i % 4 = 0 THEN 'PENDING' ELSE 'SUCCEEDED' END, 'tests', now() - interval '1 hour',
               now() - interval '1 hour', now() + interval '1 hour', now() - interval '1 hour', 'x'
        FROM generate_series(1, 20000) AS i
        """
    )
    await pg.execute("ANALYZE tasks")
    # the partial index, and on the partitioned table its partitions' indexes
    ours = {
        r["relname"]
        for r in await pg.fetch(
            "SELECT c.relname FROM pg_class c WHERE c.oid = 'tasks_open_device_id'::regclass "
            "UNION SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'tasks_open_device_id'::regclass"
        )
    }
    for mode in ("force_custom_plan", "force_generic_plan"):
        async with pg.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
            await conn.execute(RECONCILE_PAGE_SETTINGS)  # as TaskStore.reconcile_page runs it
            plan = json.loads(
                await conn.fetchval("EXPLAIN (FORMAT JSON) " + RECONCILE_PAGE_SQL, "", uuid.UUID(int=0), 500, 60.0)
            )
        nodes = list(_nodes(plan[0]["Plan"]))
        # Then every scan is an ordered (index-only) scan of that index: no table scan, no sort of the open tasks
        scans = [n for n in nodes if "Relation Name" in n]
        assert scans and all(
            n["Node Type"] in ("Index Only Scan", "Index Scan") and n["Index Name"] in ours for n in scans
        ), nodes
        assert not any(n["Node Type"] == "Sort" for n in nodes), nodes
    rows = await TaskStore(pg).reconcile_page(None, 500, 60.0)
    assert len(rows) == 500
    assert [(r["device"], r["id"]) for r in rows] == sorted((r["device"], r["id"]) for r in rows)


def _nodes(node: dict[str, object]) -> Iterator[dict[str, object]]:
    yield node
    for child in node.get("Plans", []):  # type: ignore[union-attr]
        yield from _nodes(child)


async def test_the_keyset_pages_cover_every_open_task_once(settings: Settings, pg: asyncpg.Pool) -> None:
    tasks = TaskStore(pg)
    batch = [new_task(f"AA:BB:CC:DD:EE:{i % 7:02X}") for i in range(53)]
    await tasks.insert(batch)
    await age(pg)
    seen: list[uuid.UUID] = []
    after = None
    while rows := await tasks.reconcile_page(after, 5, 1.0):
        seen += [r["id"] for r in rows]
        after = (rows[-1]["device"], rows[-1]["id"])
    assert sorted(seen) == sorted(t.task_id for t in batch) and len(seen) == 53
