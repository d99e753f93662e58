"""The statistics rollups (migration 0015): every SQL statement GetStats runs, and the processing-time histogram.

The triggers of migration 0015 keep `task_stats` (per caller, UTC hour, device, type and verdict: tasks by final
status, device reports, a histogram of processing times) and `task_stats_words` (hits per word and category) up to
date as tasks become final and devices report. A query here reads only those rows — a range of their primary key
(caller, hour, ...) for one caller, of their hour index for every caller — and merges them: a day is the sum of its
hours, a bucket without `by_device` the sum of its devices. Percentiles come from the merged histogram.

What is open now (pending, assigned, running) is counted from the tasks themselves, through the partial index of
open tasks by caller (`tasks_open_caller`): as many index entries as the caller's backlog.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

#: histogram buckets per doubling of the processing time, the time bucket 0 starts at, and how many there are
#: (the SQL function stats_bucket of migration 0015 says the same)
BUCKETS_PER_DOUBLING = 4
BUCKET_BASE_MS = 0.01
BUCKETS = 120
FINAL_COLUMNS = ("succeeded", "failed", "expired", "cancelled", "dead_lettered")
COUNT_COLUMNS = (*FINAL_COLUMNS, "reported")
#: the open statuses as SQL literals: the partial index tasks_open_caller is used only when the planner can prove its
#: predicate from the query's text
_OPEN_SQL = "'PENDING', 'ASSIGNED', 'RUNNING'"


def bucket_of(ms: float) -> int:
    """The histogram bucket of a processing time (as stats_bucket in SQL)."""
    if ms < 0.0119:
        return 0
    return min(BUCKETS - 1, math.floor(BUCKETS_PER_DOUBLING * math.log(ms / BUCKET_BASE_MS) / math.log(2)))


def bucket_ms(bucket: int) -> float:
    """What a bucket reads as: the geometric middle of its range (within 9 % of every time in it)."""
    return BUCKET_BASE_MS * 2 ** ((bucket + 0.5) / BUCKETS_PER_DOUBLING)


def percentile_ms(histogram: Sequence[int], q: float) -> float | None:
    """The `q` quantile (0 < q <= 1, nearest rank) of the times a histogram counts; None when it counts none."""
    total = sum(n for n in histogram if n > 0)
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket, n in enumerate(histogram):
        seen += max(n, 0)
        if seen >= rank:
            return bucket_ms(bucket)
    return bucket_ms(len(histogram) - 1)


def add_histograms(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    size = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(size))


@dataclass(frozen=True, slots=True)
class Counts:
    """Tasks by final status, device reports, and the succeeded tasks' processing-time histogram."""

    succeeded: int = 0
    failed: int = 0
    expired: int = 0
    cancelled: int = 0
    dead_lettered: int = 0
    reported: int = 0
    histogram: tuple[int, ...] = ()

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.expired + self.cancelled + self.dead_lettered

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.succeeded + other.succeeded,
            self.failed + other.failed,
            self.expired + other.expired,
            self.cancelled + other.cancelled,
            self.dead_lettered + other.dead_lettered,
            self.reported + other.reported,
            add_histograms(self.histogram, other.histogram),
        )


@dataclass(frozen=True, slots=True)
class StatsQuery:
    """What GetStats asks for, checked: [start, end) on whole periods (UTC hours or days)."""

    #: None: every caller's
    caller: str | None
    start: datetime
    end: datetime
    #: days (else hours)
    daily: bool
    device: str | None = None
    #: TEXT or OCR_IMAGE; None: both
    task_type: str | None = None
    #: a bucket per caller (else callers are summed)
    by_caller: bool = False
    #: a bucket per device (else devices are summed)
    by_device: bool = False
    #: how many top words and categories
    top: int = 10

    @property
    def period(self) -> timedelta:
        return timedelta(days=1) if self.daily else timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Bucket:
    """One period's counts for one key ("" for a dimension that is summed over, verdict "" for no result)."""

    start: datetime
    caller: str
    device: str
    task_type: str
    verdict: str
    counts: Counts


@dataclass(slots=True)
class Stats:
    buckets: list[Bucket] = field(default_factory=list)
    #: buckets were left out (those from `next_start` on)
    truncated: bool = False
    next_start: datetime | None = None
    totals: Counts = Counts()
    #: open tasks now, by status (PENDING, ASSIGNED, RUNNING)
    queue: dict[str, int] = field(default_factory=dict)
    #: (word, category, hits), most hit first
    top_words: list[tuple[str, str, int]] = field(default_factory=list)
    #: (category, hits), most hit first
    top_categories: list[tuple[str, int]] = field(default_factory=list)


class _Filter:
    """The WHERE clause of a query on the rollups, and its parameters."""

    def __init__(self, query: StatsQuery) -> None:
        self.params: list[Any] = [query.start, query.end]
        self.clauses = ["hour >= $1", "hour < $2"]
        for column, value in (("caller", query.caller), ("device", query.device), ("type", query.task_type)):
            if value is not None:
                self.params.append(value)
                self.clauses.append(f"{column} = ${len(self.params)}")

    def add(self, value: Any) -> str:
        self.params.append(value)
        return f"${len(self.params)}"

    @property
    def sql(self) -> str:
        return " AND ".join(self.clauses)


def _keys(query: StatsQuery) -> str:
    period = "date_trunc('day', hour, 'UTC')" if query.daily else "hour"
    caller = "caller" if query.by_caller else "''::text"
    device = "device" if query.by_device else "''::text"
    return f"{period} AS period, {caller} AS caller, {device} AS device, type, verdict"


_SUMS = ", ".join(f"sum({c})::bigint AS {c}" for c in COUNT_COLUMNS)
_ANY = " OR ".join(f"sum({c}) <> 0" for c in COUNT_COLUMNS)


def groups_sql(query: StatsQuery, where: _Filter, limit: int) -> str:
    return (
        f"SELECT {_keys(query)}, {_SUMS} FROM task_stats WHERE {where.sql} "
        f"GROUP BY 1, 2, 3, 4, 5 HAVING {_ANY} ORDER BY 1, 2, 3, 4, 5 LIMIT {where.add(limit)}"
    )


def histograms_sql(query: StatsQuery, where: _Filter, before: datetime) -> str:
    """(key..., bucket, n) of the buckets' histograms, for hours before `before`."""
    return (
        f"SELECT {_keys(query)}, u.i::int - 1 AS bucket, sum(u.n)::bigint AS n "
        f"FROM task_stats CROSS JOIN LATERAL unnest(processing_ms) WITH ORDINALITY AS u(n, i) "
        f"WHERE {where.sql} AND hour < {where.add(before)} AND cardinality(processing_ms) > 0 "
        f"GROUP BY 1, 2, 3, 4, 5, 6 HAVING sum(u.n) <> 0"
    )


def totals_sql(where: _Filter) -> str:
    return f"SELECT {_SUMS} FROM task_stats WHERE {where.sql}"


def total_histogram_sql(where: _Filter) -> str:
    return (
        "SELECT u.i::int - 1 AS bucket, sum(u.n)::bigint AS n "
        "FROM task_stats CROSS JOIN LATERAL unnest(processing_ms) WITH ORDINALITY AS u(n, i) "
        f"WHERE {where.sql} AND cardinality(processing_ms) > 0 GROUP BY 1"
    )


def top_words_sql(where: _Filter, top: int) -> str:
    return (
        f"SELECT word, category, sum(hits)::bigint AS hits FROM task_stats_words WHERE {where.sql} "
        f"GROUP BY word, category HAVING sum(hits) > 0 ORDER BY 3 DESC, 1, 2 LIMIT {where.add(top)}"
    )


def top_categories_sql(where: _Filter, top: int) -> str:
    return (
        f"SELECT category, sum(hits)::bigint AS hits FROM task_stats_words WHERE {where.sql} "
        f"GROUP BY category HAVING sum(hits) > 0 ORDER BY 2 DESC, 1 LIMIT {where.add(top)}"
    )


def queue_sql(query: StatsQuery) -> tuple[str, list[Any]]:
    """Open tasks now by status (of the caller, device and type asked for): a range of tasks_open_caller for one
    caller."""
    params: list[Any] = []
    clauses = [f"status IN ({_OPEN_SQL})"]
    for column, value in (("caller", query.caller), ("device", query.device), ("type", query.task_type)):
        if value is not None:
            params.append(value)
            clauses.append(f"{column} = ${len(params)}")
    return f"SELECT status, count(*) AS n FROM tasks WHERE {' AND '.join(clauses)} GROUP BY status", params


def _histogram(pairs: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    counts: dict[int, int] = {}
    for bucket, n in pairs:
        if 0 <= bucket < BUCKETS:
            counts[bucket] = counts.get(bucket, 0) + n
    if not counts:
        return ()
    return tuple(counts.get(b, 0) for b in range(max(counts) + 1))


def _counts(row: asyncpg.Record, histogram: tuple[int, ...] = ()) -> Counts:
    succeeded, failed, expired, cancelled, dead_lettered, reported = (int(row[c] or 0) for c in COUNT_COLUMNS)
    return Counts(succeeded, failed, expired, cancelled, dead_lettered, reported, histogram)


async def fold(pool: asyncpg.Pool) -> int:
    """Folds what became final since the last fold into the rollups (migration 0015 `fold_task_stats`, one at a
    time, each change exactly once); returns the changes folded."""
    return int(await pool.fetchval("SELECT fold_task_stats()"))


async def read_stats(pool: asyncpg.Pool, query: StatsQuery, max_buckets: int) -> Stats:
    """The statistics of `query`: at most `max_buckets` buckets (time order, then caller, device, type, verdict),
    totals over the whole query, the queue now, the top words and categories. What became final before the call is
    folded in first; then one read-only snapshot."""
    await fold(pool)
    stats = Stats()
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        where = _Filter(query)
        rows = await conn.fetch(groups_sql(query, where, max_buckets + 1), *where.params)
        before = query.end
        if len(rows) > max_buckets:
            stats.truncated = True
            cut = rows[max_buckets]["period"]
            kept = [r for r in rows if r["period"] < cut]
            # one period alone holds more than max_buckets: its first ones, and the rest of it is left out
            rows, before = (kept, cut) if kept else (rows[:max_buckets], cut + query.period)
            stats.next_start = before
        where = _Filter(query)
        pairs: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
        for r in await conn.fetch(histograms_sql(query, where, before), *where.params):
            pairs.setdefault(tuple(r[k] for k in ("period", "caller", "device", "type", "verdict")), []).append(
                (r["bucket"], int(r["n"]))
            )
        for r in rows:
            key = (r["period"], r["caller"], r["device"], r["type"], r["verdict"])
            stats.buckets.append(Bucket(*key, _counts(r, _histogram(pairs.get(key, ())))))
        if stats.truncated:
            where = _Filter(query)
            total_row = await conn.fetchrow(totals_sql(where), *where.params)
            where = _Filter(query)
            histogram = _histogram(
                (r["bucket"], int(r["n"])) for r in await conn.fetch(total_histogram_sql(where), *where.params)
            )
            assert total_row is not None  # an aggregate without GROUP BY answers one row
            stats.totals = _counts(total_row, histogram)
        else:
            for b in stats.buckets:
                stats.totals += b.counts
        where = _Filter(query)
        words = await conn.fetch(top_words_sql(where, query.top), *where.params)
        stats.top_words = [(r["word"], r["category"], int(r["hits"])) for r in words]
        where = _Filter(query)
        categories = await conn.fetch(top_categories_sql(where, query.top), *where.params)
        stats.top_categories = [(r["category"], int(r["hits"])) for r in categories]
        sql, params = queue_sql(query)
        stats.queue = {r["status"]: int(r["n"]) for r in await conn.fetch(sql, *params)}
    return stats
