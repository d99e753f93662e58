"""Retention of the record: finished tasks, their results, image bytes, idempotency keys and device reports are
deleted once they are older than `SIEVE_RETENTION_DAYS`, by dropping whole day partitions (migration 0008); device
reports (not partitioned) by their received_at, in batches.

`tasks` and `results` are range-partitioned by task id, one partition per UTC day (`tasks_pYYYYMMDD`,
`results_pYYYYMMDD`, bounds `uuid7_floor` of the day's first millisecond: task ids are UUIDv7, sieve/ids.py),
plus a DEFAULT partition each for ids outside every day (the random ids of tasks recorded before ids were
time-ordered; a day whose partition was not made in time). One `Retention.run`:

1. makes the partitions of today and the next `retention_ahead_days` days, and of each past day since the newest
   one whose tasks wait in the DEFAULT partition (nothing ran that day): rows of a day in the DEFAULT partition
   move into the day's partition when it is made;
2. drops the two partitions of every day that ended more than `retention_days` ago and whose tasks are all
   final (SUCCEEDED, FAILED, EXPIRED, CANCELLED, DEAD_LETTERED) and unchanged for `retention_days`. A day with
   a task still open (a dead letter an operator requeued; every other task ends within its TTL, at most 7 days)
   is kept and looked at again on the next run;
3. deletes, in batches, the final rows of the DEFAULT partitions unchanged for `retention_days`, and the
   idempotency keys of every task deleted.
4. deletes, in batches, GetStats' rollup rows of hours older than `stats_retention_days` (migration 0015).

A day's partitions are made as tables of their own and attached (the parents locked SHARE UPDATE EXCLUSIVE: reads
and writes go on; the DEFAULT partitions are locked while checked for rows of that day). A drop holds ACCESS
EXCLUSIVE locks on `tasks` and `results` for milliseconds (its re-check of open tasks reads a partial index); a
lock_timeout of 0.5 s keeps it from queueing every query behind a long one: it waits for the next run instead.
The check that a day is settled is a plain read (no lock); the drop's re-check sees a task opened again since, not
one opened and finished again within that moment. Only one process runs it at a time per schema (an advisory
lock), so every scheduler replica may call it. The scheduler's `retention` job (scheduler_svc/housekeeping.py)
runs it every `retention_check_interval_s`; where services run without the right to change the schema,
`python -m sieve.db.retention` does the same as the schema's owner (a cron job).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

import asyncpg

from sieve.db.tasks import FINAL_STATUSES, OPEN_STATUSES
from sieve.ids import datetime_ms, uuid7_floor
from sieve.settings import Settings

#: what the steps run their statements on: a connection taken from the pool
_Connection = asyncpg.pool.PoolConnectionProxy

log = logging.getLogger("sieve.db.retention")

#: the partitioned tables and the column they are partitioned by (the task id)
TABLES = (("tasks", "id"), ("results", "task_id"))
_DAY_PARTITION = re.compile(r"^tasks_p(\d{8})$")
_OPEN_LITERAL = ", ".join(f"'{s}'" for s in OPEN_STATUSES)


def day_bounds(day: date) -> tuple[uuid.UUID, uuid.UUID]:
    """The partition bounds of a UTC day: [floor of its first ms, floor of the next day's first ms)."""
    start = datetime.combine(day, time(), UTC)
    return uuid7_floor(datetime_ms(start)), uuid7_floor(datetime_ms(start + timedelta(days=1)))


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


@dataclass(slots=True)
class RetentionReport:
    """What one run did."""

    #: days whose partitions were made
    created: list[date] = field(default_factory=list)
    #: days whose partitions were dropped
    dropped: list[date] = field(default_factory=list)
    #: days past retention kept: a task is still open, or changed within retention, or the lock was busy
    kept: list[date] = field(default_factory=list)
    #: task rows moved from the DEFAULT partition into a day partition made for them
    moved: int = 0
    #: task rows deleted from the DEFAULT partition
    purged_default: int = 0
    #: idempotency keys deleted
    purged_keys: int = 0
    #: device reports (ReportDetection) deleted
    purged_reports: int = 0
    #: GetStats' rollup rows (task_stats, task_stats_words) deleted
    purged_stats: int = 0
    #: WatchTask's change feed rows (task_changes) deleted
    purged_changes: int = 0
    #: finished callback deliveries deleted
    purged_deliveries: int = 0
    #: external jobs' stage rows (external_jobs) deleted: completed or failed before the cutoff
    purged_external: int = 0
    #: False when another process held the retention lock (nothing was done)
    ran: bool = True


class Retention:
    """Owns the day partitions of `tasks` and `results` and the deletion of what is past retention."""

    def __init__(
        self, pool: asyncpg.Pool, settings: Settings, *, batch: int = 5000, lock_timeout_s: float = 0.5
    ) -> None:
        self.pool = pool
        self.retention_days = settings.retention_days
        self.stats_retention_days = settings.stats_retention_days
        self.watch_history_s = settings.watch_history_s
        self.ahead_days = settings.retention_ahead_days
        self.batch = batch
        self.lock_timeout_ms = int(lock_timeout_s * 1000)
        self._lock_key = zlib.crc32(f"sieve-retention:{settings.database_schema}".encode())

    # --- the whole job ------------------------------------------------------------------------------
    async def run(self, now: datetime | None = None) -> RetentionReport:
        """Makes the partitions ahead, then drops and deletes what is past retention (retention_days 0: keep
        everything). Returns at once, having done nothing, while another process runs it."""
        now = now or datetime.now(UTC)
        report = RetentionReport()
        async with self.pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", self._lock_key):
                report.ran = False
                return report
            try:
                await self._ensure_partitions(conn, now, report)
                if self.retention_days > 0:
                    await self._drop_old_days(conn, now, report)
                    await self._purge_default(conn, now, report)
                    await self._purge_reports(conn, now, report)
                    await self._purge_deliveries(conn, now, report)
                    await self._purge_external(conn, now, report)
                await self._purge_changes(conn, now, report)
                if self.stats_retention_days > 0:
                    await self._purge_stats(conn, now, report)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", self._lock_key)
        if report.created or report.dropped or report.purged_default or report.moved or report.purged_reports:
            log.info(
                "retention: made %s, dropped %s, kept %s, moved %d, deleted %d from the default partition, "
                "%d idempotency keys, %d device reports",
                [str(d) for d in report.created],
                [str(d) for d in report.dropped],
                [str(d) for d in report.kept],
                report.moved,
                report.purged_default,
                report.purged_keys,
                report.purged_reports,
            )
        return report

    async def day_partitions(self) -> list[date]:
        """The days that have partitions, oldest first."""
        async with self.pool.acquire() as conn:
            return await self._days(conn)

    # --- partitions ahead ---------------------------------------------------------------------------
    async def _days(self, conn: _Connection) -> list[date]:
        rows = await conn.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'tasks'::regclass"
        )
        days = []
        for r in rows:
            found = _DAY_PARTITION.match(r["relname"])
            if found:
                days.append(datetime.strptime(found.group(1), "%Y%m%d").date())
        return sorted(days)

    async def _ensure_partitions(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Today and the days ahead get partitions; a past day since the newest partition gets one only when the
        DEFAULT partition holds tasks of it (the job did not run that day)."""
        today = now.astimezone(UTC).date()
        existing = set(await self._days(conn))
        past = [d for d in existing if d < today]
        wanted = []
        day = max(past) + timedelta(days=1) if past else today
        while day < today:
            lo, hi = day_bounds(day)
            if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM tasks_default WHERE id >= $1 AND id < $2)", lo, hi):
                wanted.append(day)
            day += timedelta(days=1)
        wanted += [today + timedelta(days=i) for i in range(self.ahead_days + 1)]
        for day in wanted:
            if day in existing:
                continue
            try:
                report.moved += await self._create_day(conn, day)
                report.created.append(day)
            except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as exc:
                log.warning("partition of %s not made this time (%s)", day, exc)

    async def _create_day(self, conn: _Connection, day: date) -> int:
        """Makes the tasks and results partitions of a day, moving the day's rows out of the DEFAULT partitions
        (an ATTACH of a table filled with them); returns how many task rows moved."""
        lo, hi = day_bounds(day)
        moved = 0
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = {self.lock_timeout_ms}")
            for table, column in TABLES:
                name, default = partition_name(table, day), default_name(table)
                # a table of its own, then ATTACH: that locks the parent SHARE UPDATE EXCLUSIVE (reads and writes
                # go on), where CREATE TABLE ... PARTITION OF would lock it ACCESS EXCLUSIVE
                await conn.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING ALL EXCLUDING INDEXES)")
                stray = await conn.fetchval(
                    f"WITH m AS (DELETE FROM {default} WHERE {column} >= $1 AND {column} < $2 RETURNING *), "
                    f"i AS (INSERT INTO {name} SELECT * FROM m RETURNING 1) SELECT count(*) FROM i",
                    lo,
                    hi,
                )
                await conn.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ('{lo}') TO ('{hi}')")
                if table == "tasks":
                    moved = stray
        return moved

    # --- dropping old days --------------------------------------------------------------------------
    async def _drop_old_days(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        cutoff = now - timedelta(days=self.retention_days)
        for day in await self._days(conn):
            if datetime.combine(day + timedelta(days=1), time(), UTC) > cutoff:
                break  # this day and every later one are within retention
            if not await self._settled(conn, day, cutoff):
                report.kept.append(day)
                continue
            try:
                dropped = await self._drop_day(conn, day)
            except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as exc:
                log.warning("partitions of %s not dropped this time (%s)", day, exc)
                dropped = False
            if not dropped:
                report.kept.append(day)
                continue
            report.dropped.append(day)
            report.purged_keys += await self._purge_keys(conn, *day_bounds(day))
        # keys left by a run that stopped between a drop and the purge of its keys (older than every day kept)
        days = await self._days(conn)
        if days:
            report.purged_keys += await self._purge_keys(conn, uuid.UUID(int=0), day_bounds(days[0])[0])

    async def _settled(self, conn: _Connection, day: date, cutoff: datetime) -> bool:
        """Whether every task of the day is final and unchanged since before the cutoff: a plain read (no lock
        that would hold up the writers of the table); _drop_day checks again under its lock for open tasks, the
        only way a final task changes (a dead letter requeued)."""
        name = partition_name("tasks", day)
        busy = await conn.fetchval(
            f"SELECT EXISTS (SELECT 1 FROM {name} WHERE status <> ALL($1::text[]) OR updated_at >= $2)",
            list(FINAL_STATUSES),
            cutoff,
        )
        if busy:
            still_open = await conn.fetchval(
                f"SELECT count(*) FROM {name} WHERE status = ANY($1::text[])", list(OPEN_STATUSES)
            )
            if still_open:
                log.info("partition %s is past retention but %d of its tasks are still open: kept", name, still_open)
        return not busy

    async def _drop_day(self, conn: _Connection, day: date) -> bool:
        """Drops the day's two partitions unless a task in it was opened again meanwhile (a revived dead
        letter): the re-check reads the partial index of open tasks under the locks."""
        tasks, results = partition_name("tasks", day), partition_name("results", day)
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = {self.lock_timeout_ms}")
            await conn.execute("LOCK TABLE tasks, results IN ACCESS EXCLUSIVE MODE")
            # the status list literal, so that the planner reads the partial index of open tasks, not the table
            if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {tasks} WHERE status IN ({_OPEN_LITERAL}))"):
                return False
            await conn.execute(f"DROP TABLE IF EXISTS {results}")
            await conn.execute(f"DROP TABLE {tasks}")
        return True

    # --- the DEFAULT partitions and idempotency keys ------------------------------------------------------
    async def _purge_default(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Deletes final rows of the DEFAULT partitions unchanged since the cutoff, in batches walking the
        primary key (each batch one statement: tasks, their results and idempotency keys together)."""
        cutoff = now - timedelta(days=self.retention_days)
        last = uuid.UUID(int=0)
        while True:
            row = await conn.fetchrow(
                """
                WITH chosen AS (
                    SELECT id FROM tasks_default WHERE id > $1 ORDER BY id LIMIT $2
                ), gone AS (
                    DELETE FROM tasks_default t USING chosen c
                    WHERE t.id = c.id AND t.status = ANY($3::text[]) AND t.updated_at < $4
                    RETURNING t.id
                ), results_gone AS (
                    DELETE FROM results_default r USING gone g WHERE r.task_id = g.id
                ), keys_gone AS (
                    DELETE FROM idempotency_keys k USING gone g WHERE k.task_id = g.id RETURNING 1
                )
                SELECT (SELECT id FROM chosen ORDER BY id DESC LIMIT 1) AS last, (SELECT count(*) FROM chosen) AS seen,
                       (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM keys_gone) AS keys
                """,
                last,
                self.batch,
                list(FINAL_STATUSES),
                cutoff,
            )
            assert row is not None  # a SELECT of scalar subqueries answers exactly one row
            report.purged_default += row["deleted"]
            report.purged_keys += row["keys"]
            if row["seen"] < self.batch:
                return
            last = row["last"]

    async def _purge_reports(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Deletes device reports received before the cutoff, oldest first, in batches (their received_at index)."""
        cutoff = now - timedelta(days=self.retention_days)
        while True:
            deleted: int = await conn.fetchval(
                """
                WITH chosen AS (
                    SELECT caller, device, report_id FROM device_reports WHERE received_at < $1
                    ORDER BY received_at LIMIT $2
                ), gone AS (
                    DELETE FROM device_reports r USING chosen c
                    WHERE (r.caller, r.device, r.report_id) = (c.caller, c.device, c.report_id)
                    RETURNING 1
                )
                SELECT count(*) FROM gone
                """,
                cutoff,
                self.batch,
            )
            report.purged_reports += deleted
            if deleted < self.batch:
                return

    async def _purge_changes(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Deletes WatchTask's changes older than watch_history_s, oldest transaction first, in batches (the xid
        index), and records the newest transaction deleted: a cursor that had not seen all of it is OUT_OF_RANGE."""
        cutoff = now - timedelta(seconds=self.watch_history_s)
        await conn.fetchval("SELECT fold_task_stats()")  # GetStats' rollups count them before they go
        while True:
            row = await conn.fetchrow(
                """
                WITH oldest AS (
                    SELECT ctid FROM task_changes ORDER BY xid LIMIT $2
                ), gone AS (
                    DELETE FROM task_changes c USING oldest o WHERE c.ctid = o.ctid AND c.logged_at < $1
                    RETURNING c.xid
                ), mark AS (
                    UPDATE task_changes_purged SET up_to = greatest(up_to, (SELECT max(xid) FROM gone))
                    WHERE EXISTS (SELECT 1 FROM gone)
                )
                SELECT count(*) AS deleted FROM gone
                """,
                cutoff,
                self.batch,
            )
            assert row is not None
            report.purged_changes += row["deleted"]
            if row["deleted"] < self.batch:
                return

    async def _delete_in_batches(self, conn: _Connection, cutoff: datetime, sql: str) -> int:
        """Runs a delete of at most $2 rows older than $1 (`sql` returns how many it deleted) until a batch
        comes back short; returns how many were deleted in all."""
        total = 0
        while True:
            deleted: int = await conn.fetchval(sql, cutoff, self.batch)
            total += deleted
            if deleted < self.batch:
                return total

    async def _purge_deliveries(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Deletes callback deliveries made before the cutoff that are DELIVERED or GAVE_UP, in batches."""
        report.purged_deliveries += await self._delete_in_batches(
            conn,
            now - timedelta(days=self.retention_days),
            """
                WITH chosen AS (
                    SELECT task_id, seq FROM callback_deliveries
                    WHERE created_at < $1 AND state IN ('DELIVERED', 'GAVE_UP')
                    ORDER BY created_at LIMIT $2
                ), gone AS (
                    DELETE FROM callback_deliveries d USING chosen c
                    WHERE (d.task_id, d.seq) = (c.task_id, c.seq)
                    RETURNING 1
                )
                SELECT count(*) FROM gone
                """,
        )

    async def _purge_external(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Deletes external jobs' stage rows that ended (completed, or failed at the provider) before the cutoff,
        in batches; a stage still submitting, submitted or succeeded (its output not stored yet) stays, whatever its
        age: an engine may still resume it."""
        report.purged_external += await self._delete_in_batches(
            conn,
            now - timedelta(days=self.retention_days),
            """
                WITH chosen AS (
                    SELECT task_id, stage FROM external_jobs
                    WHERE created_at < $1 AND state IN ('completed', 'failed')
                      AND coalesce(finished_at, created_at) < $1
                    ORDER BY created_at LIMIT $2
                ), gone AS (
                    DELETE FROM external_jobs j USING chosen c
                    WHERE (j.task_id, j.stage) = (c.task_id, c.stage)
                    RETURNING 1
                )
                SELECT count(*) FROM gone
                """,
        )

    async def _purge_stats(self, conn: _Connection, now: datetime, report: RetentionReport) -> None:
        """Deletes GetStats' rollup rows of hours older than `stats_retention_days`, oldest first, in batches (their
        hour indexes; migration 0015). They are kept apart from the tasks they count: rollups outlive them."""
        cutoff = now - timedelta(days=self.stats_retention_days)
        for table in ("task_stats", "task_stats_words"):
            while True:
                deleted: int = await conn.fetchval(
                    f"""
                    WITH gone AS (
                        DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                            SELECT ctid FROM {table} WHERE hour < $1 ORDER BY hour LIMIT $2))
                        RETURNING 1
                    )
                    SELECT count(*) FROM gone
                    """,
                    cutoff,
                    self.batch,
                )
                report.purged_stats += deleted
                if deleted < self.batch:
                    break
        if report.purged_stats:
            log.info("retention: deleted %d statistics rows of hours before %s", report.purged_stats, cutoff)

    async def _purge_keys(self, conn: _Connection, lo: uuid.UUID, hi: uuid.UUID) -> int:
        """Deletes the idempotency keys of tasks in [lo, hi) that no longer exist, in batches walking the
        task-id index (a task has at most one key)."""
        total: int = 0
        last, first = lo, True
        while True:
            row = await conn.fetchrow(
                """
                WITH chosen AS (
                    SELECT caller, device, key, task_id FROM idempotency_keys
                    WHERE (task_id > $1 OR ($4 AND task_id = $1)) AND task_id < $2
                    ORDER BY task_id LIMIT $3
                ), gone AS (
                    DELETE FROM idempotency_keys k USING chosen c
                    WHERE (k.caller, k.device, k.key) = (c.caller, c.device, c.key)
                      AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = k.task_id)
                    RETURNING 1
                )
                SELECT (SELECT task_id FROM chosen ORDER BY task_id DESC LIMIT 1) AS last,
                       (SELECT count(*) FROM chosen) AS seen, (SELECT count(*) FROM gone) AS deleted
                """,
                last,
                hi,
                self.batch,
                first,
            )
            assert row is not None  # a SELECT of scalar subqueries answers exactly one row
            total += row["deleted"]
            if row["seen"] < self.batch:
                return total
            last, first = row["last"], False


async def _main() -> None:
    from sieve.db import create_pool
    from sieve.observe.logs import setup_logging

    parser = argparse.ArgumentParser(description="Make the partitions ahead and delete what is past retention.")
    parser.parse_args()
    settings = Settings.from_env()
    setup_logging("retention", settings.log_level)
    pool = await create_pool(settings)
    try:
        report = await Retention(pool, settings).run()
        print(report)
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(_main())
