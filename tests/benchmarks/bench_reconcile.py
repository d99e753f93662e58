"""Reconciliation at scale: one pass over a tasks table of a million rows (scheduler_svc/reconcile.py).

    .venv/bin/python -m tests.benchmarks.bench_reconcile [--rows 1000000] [--open 20000] [--devices 2000]
                                                         [--lost 100] [--passes 5] [--page 5000] [--no-compare]

Builds, in a schema and a Redis prefix of its own (both removed afterwards), `--rows` tasks of which `--open` are
open (PENDING) over `--devices` devices and the rest SUCCEEDED; every open task is in Redis as the scheduler would
have it (most queued, some leased, some waiting in the delayed set) except `--lost` of them, which no queue holds.
Then it times `--passes` reconciliation passes: the first must re-queue exactly the lost tasks, the others find
nothing. Printed: the time of each pass, open tasks checked per second, the page query's plan and buffers (it must
read the partial index of open tasks, migration 0009), and, unless --no-compare, one pass with that index dropped
(and the older one on enqueued_at: what the same pass costs when PostgreSQL has to find the open tasks among all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections import defaultdict

import asyncpg
from redis.asyncio import Redis

from scheduler_svc.reconcile import Reconciler
from sieve.db import create_pool
from sieve.db.tasks import RECONCILE_PAGE_SETTINGS, RECONCILE_PAGE_SQL, TaskStore, type_value
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.settings import Settings
from tests.support.redis import delete_prefix
from tests.support.stores import DATABASE_URL, REDIS_URL, drop_schema


def _ms(moment: object) -> int:
    return int(moment.timestamp() * 1000)  # type: ignore[attr-defined]


async def build(pg: asyncpg.Pool, queues: QueueStore, rows: int, open_: int, devices: int, lost: int) -> None:
    started = time.perf_counter()
    every = max(1, rows // open_)
    # ids are UUIDv7 of the last hour (so they land in today's partition when tasks is partitioned by day);
    # open tasks are every `every`-th row, spread over the devices
    await pg.execute(
        """
        INSERT INTO tasks (id, device, type, priority, status, caller, created_at, updated_at, expires_at,
                           enqueued_at, payload_text, lease, attempts)
        SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - 3600000 + i / 300), 12, '0')
                || '7' || substr(md5(i::text), 1, 19))::uuid,
               'AA:BB:CC:' || lpad(to_hex((i / $2) % $3 / 256), 2, '0') || ':' || lpad(to_hex((i / $2) % $3 % 256), 2,
                                                                                     '0') || ':00',
               'TEXT', 3, CASE WHEN i % $2 = 0 AND i / $2 < $4 THEN 'PENDING' ELSE 'SUCCEEDED' END, 'bench',
               now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 hour',
               now() - interval '1 hour', 'hello ' || i, 0, 0
        FROM generate_series(0, $1 - 1) AS i
        """,
        rows,
        every,
        devices,
        open_,
    )
    await pg.execute("ANALYZE tasks")
    print(f"built {rows} rows ({open_} open) in {time.perf_counter() - started:.1f} s")
    # Redis holds every open task but `lost` of them: most queued, 10 % leased, 5 % delayed
    open_rows = await pg.fetch(
        "SELECT id, device, type, priority, enqueued_at, expires_at FROM tasks WHERE status = 'PENDING' ORDER BY id"
    )
    skip = {r["id"] for r in open_rows[:: max(1, len(open_rows) // lost)][:lost]}
    groups: dict[str, list[Entry]] = defaultdict(list)
    for r in open_rows:
        if r["id"] not in skip:
            groups[r["device"]].append(
                Entry(
                    str(r["id"]),
                    type_value(r["type"]),
                    r["priority"],
                    _ms(r["enqueued_at"]),
                    _ms(r["expires_at"]),
                    caller="bench",
                )
            )
    macs = list(groups)
    for i in range(0, len(macs), 200):
        await queues.enqueue_many({m: groups[m] for m in macs[i : i + 200]}, admit=False)
    for n, mac in enumerate(macs):
        if n % 10 == 0:
            popped = await queues.pop(mac, "bench", max(1, len(groups[mac]) // 3), release=True)
            if n % 20 == 0 and popped.taken:
                await queues.requeue(
                    mac,
                    [(e.task_id, e.attempt) for e in popped.taken],
                    count_attempt=False,
                    reason="bench",
                    retry_at_ms=now_ms() + 3_600_000,
                )
    k = queues.keys
    print(
        f"Redis: {await queues.pending()} queued, {await queues.redis.zcard(k.leases)} leased, "
        f"{await queues.redis.zcard(k.delayed)} delayed, {len(skip)} lost"
    )


async def explain(pg: asyncpg.Pool, page: int) -> None:
    async with pg.acquire() as conn, conn.transaction():
        await conn.execute(RECONCILE_PAGE_SETTINGS)  # as TaskStore.reconcile_page runs it
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + RECONCILE_PAGE_SQL, "", uuid.UUID(int=0), page, 60.0
        )
    top = json.loads(plan)[0] if isinstance(plan, str) else plan[0]
    indexes = sorted({n.get("Index Name") for n in _nodes(top["Plan"]) if n.get("Index Name")})
    kinds = sorted({n["Node Type"] for n in _nodes(top["Plan"])})
    p = top["Plan"]
    print(
        f"first page query: {top['Execution Time']:.1f} ms, rows {p['Actual Rows']}, shared buffers hit "
        f"{p.get('Shared Hit Blocks', 0)} read {p.get('Shared Read Blocks', 0)}; nodes {kinds}; indexes {indexes}"
    )


def _nodes(node: dict[str, object]):  # type: ignore[no-untyped-def]
    yield node
    for child in node.get("Plans", []):  # type: ignore[union-attr]
        yield from _nodes(child)


async def timed_passes(reconciler: Reconciler, passes: int, lost: int) -> list[float]:
    times: list[float] = []
    for n in range(passes):
        report = await reconciler.run_pass()
        times.append(report.seconds)
        expected = lost if n == 0 else 0
        assert report.found["requeued"] == expected, (n, report)
        assert not report.stopped, report
        print(
            f"pass {n + 1}: {report.seconds * 1000:.0f} ms, {report.checked} open tasks in {report.pages} pages "
            f"({report.checked / report.seconds:,.0f} tasks/s); found {dict(report.found) or 'nothing'}"
        )
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--open", type=int, default=20_000)
    parser.add_argument("--devices", type=int, default=2_000)
    parser.add_argument("--lost", type=int, default=100)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--page", type=int, default=5000)
    parser.add_argument("--no-compare", action="store_true")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(
        {},
        redis_url=REDIS_URL,
        redis_prefix=f"bench-rec-{tag}",
        database_url=DATABASE_URL,
        database_schema=f"bench_rec_{tag}",
        reconcile_grace_s=60.0,
        reconcile_page_rows=args.page,
        max_per_device_pending=1_000_000,
    )
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    pg = await create_pool(settings, attempts=1)
    try:
        queues = QueueStore(redis, settings)
        await redis.set(queues.keys.generation, "bench")
        await build(pg, queues, args.rows, args.open, args.devices, args.lost)
        await explain(pg, args.page)
        reconciler = Reconciler(queues, TaskStore(pg))
        times = await timed_passes(reconciler, args.passes, args.lost)
        rest = times[1:] or times
        print(
            f"RESULT rows={args.rows} open={args.open} devices={args.devices}: pass median "
            f"{statistics.median(rest) * 1000:.0f} ms (min {min(rest) * 1000:.0f}, max {max(rest) * 1000:.0f}); "
            f"first pass (re-queues {args.lost}) {times[0] * 1000:.0f} ms"
        )
        if not args.no_compare:
            # neither partial index of open tasks: (device, id) of 0009, nor (enqueued_at) that rebuilds read
            await pg.execute("DROP INDEX tasks_open_device_id")
            for name in await pg.fetch(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename = 'tasks' AND indexdef LIKE '%(enqueued_at)%'"
            ):
                await pg.execute(f'DROP INDEX "{name[0]}"')
            await pg.execute("ANALYZE tasks")
            await explain(pg, args.page)
            [without] = await timed_passes(reconciler, 1, 0)
            print(f"RESULT without an index of open tasks: one pass {without * 1000:.0f} ms")
    finally:
        await pg.close()
        await drop_schema(settings.database_url, settings.database_schema)
        await delete_prefix(redis, settings.redis_prefix)
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
