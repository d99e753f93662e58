"""GetStats for the intake: a `GetStatsRequest` checked and turned into a `StatsQuery` scoped to its caller (a client
sees its own statistics; an operator every caller's, or one's), and the reply built from what sieve/db/stats.py read.

The range is cut into whole periods (UTC hours or days): the start is rounded down, the end up. Its length is
bounded (31 days of hours, 366 of days), and so is the answer (MAX_BUCKETS buckets; `truncated` says where it
stopped).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
from google.protobuf import timestamp_pb2

from intake_svc.listing import caller_scope
from intake_svc.result_view import timestamp
from intake_svc.validation import parse_device, parse_time
from sieve.db.stats import Counts, Stats, StatsQuery, percentile_ms, read_stats
from sieve.enums import enum_name, enum_value
from sieve.errors import InvalidInput
from sieve.rpc import audit
from sieve.rpc.auth import Principal
from sieve.v1 import intake_pb2, types_pb2

MAX_BUCKETS = 10_000
DEFAULT_TOP = 10
MAX_TOP = 100
MAX_CALLER = 200
#: the longest range, and the default one, by granularity (daily?)
MAX_RANGE = {False: timedelta(days=31), True: timedelta(days=366)}
DEFAULT_RANGE = {False: timedelta(hours=24), True: timedelta(days=7)}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _floor(moment: datetime, period: timedelta) -> datetime:
    return _EPOCH + (moment - _EPOCH) // period * period


def _ceil(moment: datetime, period: timedelta) -> datetime:
    floor = _floor(moment, period)
    return floor if floor == moment else floor + period


def _daily(request: intake_pb2.GetStatsRequest) -> bool:
    if request.granularity not in intake_pb2.StatsGranularity.values():
        raise InvalidInput("granularity", f"unknown granularity {request.granularity}")
    return request.granularity != intake_pb2.STATS_GRANULARITY_HOUR


def _task_type(request: intake_pb2.GetStatsRequest) -> str | None:
    if not request.type:
        return None
    if request.type not in types_pb2.TaskType.values():
        raise InvalidInput("type", f"unknown type {request.type}")
    return enum_name(types_pb2.TaskType, request.type)


def query_of(request: intake_pb2.GetStatsRequest, principal: Principal, now: datetime | None = None) -> StatsQuery:
    """The request checked and scoped to what `principal` may see; InvalidInput naming a bad field, NotPermitted for
    a client naming another caller."""
    daily = _daily(request)
    period = timedelta(days=1) if daily else timedelta(hours=1)
    end = parse_time(request.end_time, "end_time") if request.HasField("end_time") else now or datetime.now(UTC)
    start = parse_time(request.start_time, "start_time") if request.HasField("start_time") else None
    if start is not None and start >= end:
        raise InvalidInput("end_time", "must be later than start_time")
    end = _ceil(end, period)
    start = _floor(start if start is not None else max(_EPOCH, end - DEFAULT_RANGE[daily]), period)
    if end - start > MAX_RANGE[daily]:
        raise InvalidInput("start_time", f"the range may span at most {MAX_RANGE[daily].days} days at this granularity")
    if request.top > MAX_TOP:
        raise InvalidInput("top", f"must be at most {MAX_TOP}")
    return StatsQuery(
        caller=caller_scope(request.caller, principal, "read the statistics of"),
        start=start,
        end=end,
        daily=daily,
        device=parse_device(request.device_id) if request.device_id else None,
        task_type=_task_type(request),
        by_caller=request.by_caller,
        by_device=request.by_device,
        top=request.top or DEFAULT_TOP,
    )


def counts_message(counts: Counts) -> intake_pb2.StatsCounts:
    # a count made negative by a lost race cannot be: rollups only add what committed; clamp to be safe on the wire
    return intake_pb2.StatsCounts(
        succeeded=max(0, counts.succeeded),
        failed=max(0, counts.failed),
        expired=max(0, counts.expired),
        cancelled=max(0, counts.cancelled),
        dead_lettered=max(0, counts.dead_lettered),
        finished=max(0, counts.finished),
        reported=max(0, counts.reported),
        p50_processing_time_ms=round(percentile_ms(counts.histogram, 0.5) or 0.0, 4),
        p95_processing_time_ms=round(percentile_ms(counts.histogram, 0.95) or 0.0, 4),
    )


def reply_of(stats: Stats, query: StatsQuery) -> intake_pb2.GetStatsResponse:
    reply = intake_pb2.GetStatsResponse(
        start_time=timestamp(query.start),
        end_time=timestamp(query.end),
        granularity=intake_pb2.STATS_GRANULARITY_DAY if query.daily else intake_pb2.STATS_GRANULARITY_HOUR,
        truncated=stats.truncated,
        totals=counts_message(stats.totals),
        queue=intake_pb2.QueueStats(
            pending=stats.queue.get("PENDING", 0),
            assigned=stats.queue.get("ASSIGNED", 0),
            running=stats.queue.get("RUNNING", 0),
        ),
        top_words=[intake_pb2.StatsWord(word=w, category=c, hits=n) for w, c, n in stats.top_words],
        top_categories=[intake_pb2.StatsCategory(category=c, hits=n) for c, n in stats.top_categories],
    )
    if stats.next_start is not None:
        reply.next_start_time.CopyFrom(timestamp(stats.next_start))
    stamps: dict[datetime, timestamp_pb2.Timestamp] = {}
    for b in stats.buckets:
        bucket = reply.buckets.add(
            caller=b.caller,
            device_id=b.device,
            type=enum_value(types_pb2.TaskType, types_pb2.TaskType.Value("TASK_TYPE_" + b.task_type)),
            counts=counts_message(b.counts),
        )
        if b.verdict:
            bucket.verdict = enum_value(types_pb2.Verdict, types_pb2.Verdict.Value("VERDICT_" + b.verdict))
        if b.start not in stamps:
            stamps[b.start] = timestamp(b.start)
        bucket.start_time.CopyFrom(stamps[b.start])
    return reply


async def get_stats(
    pool: asyncpg.Pool, request: intake_pb2.GetStatsRequest, principal: Principal
) -> intake_pb2.GetStatsResponse:
    """GetStats for `principal`."""
    query = query_of(request, principal)
    if query.caller != principal.name:  # an operator reading other callers' statistics
        audit.cross_tenant(query.caller or "*", "statistics")
    return reply_of(await read_stats(pool, query, MAX_BUCKETS), query)
