"""`sieve workers` (the registry's live workers and their load) and `sieve stats` (the intake's statistics)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
from google.protobuf.timestamp_pb2 import Timestamp

from sieve.cli import output
from sieve.cli.client import Client
from sieve.cli.config import Role
from sieve.cli.runner import Obj, output_option, run
from sieve.v1 import intake_pb2, registry_pb2, types_pb2

TYPES = ("TEXT", "OCR_IMAGE")


def worker_row(w: registry_pb2.WorkerInfo, now: datetime) -> tuple[object, ...]:
    r = w.resources
    gpu = "-"
    if r.gpu_available:
        gpu = f"{r.gpu_count}x util {output.percent(r.gpu_util_percent)} mem {output.percent(r.gpu_memory_percent)}"
    return (
        w.worker_id,
        w.hostname,
        ",".join(output.task_type(t) for t in w.task_types),
        f"{r.active_tasks}/{w.concurrency}",
        f"{output.percent(r.cpu_percent)} of {r.cpu_count}",
        output.percent(r.memory_percent),
        gpu,
        "yes" if w.available else "no: " + "; ".join(w.unavailable_reasons),
        output.age(w.last_heartbeat, now),
    )


WORKER_COLUMNS = ("worker", "host", "types", "active", "cpu", "memory", "gpu", "available", "heartbeat")


async def list_workers(
    client: Client, task_type: types_pb2.TaskType = types_pb2.TASK_TYPE_UNSPECIFIED, available_only: bool = False
) -> list[registry_pb2.WorkerInfo]:
    reply = await client.call(
        "registry",
        client.registry().ListWorkers(
            registry_pb2.ListWorkersRequest(task_type=task_type, available_only=available_only),
            **client.options(),
        ),
    )
    return sorted(reply.workers, key=lambda w: w.worker_id)


@click.command("workers")
@click.option("--type", "task_type", type=click.Choice(TYPES, case_sensitive=False), help="Only workers of this type.")
@click.option("--available", is_flag=True, help="Only workers that can take work now.")
@output_option
@click.pass_obj
def workers_command(obj: Obj, task_type: str | None, available: bool, output_format: str) -> None:
    """List the live workers: their task types, load, resources and whether they take work (operators)."""
    type_value = output.task_type_of(task_type)

    async def body(client: Client) -> None:
        workers = await list_workers(client, type_value, available)
        if output_format == "json":
            output.print_json({"workers": [output.to_dict(w) for w in workers]})
            return
        now = datetime.now(UTC)
        output.console().print(
            output.table(f"{len(workers)} workers", WORKER_COLUMNS, (worker_row(w, now) for w in workers))
        )

    run(obj, Role.OPERATOR, body)


def counts_row(c: intake_pb2.StatsCounts) -> tuple[object, ...]:
    return (
        c.finished,
        c.succeeded,
        c.failed,
        c.expired,
        c.cancelled,
        c.dead_lettered,
        c.reported,
        f"{c.p50_processing_time_ms:.1f}",
        f"{c.p95_processing_time_ms:.1f}",
    )


COUNT_COLUMNS = ("finished", "succeeded", "failed", "expired", "cancelled", "dead", "reported", "p50 ms", "p95 ms")


def show_stats(reply: intake_pb2.GetStatsResponse, by_caller: bool, by_device: bool) -> None:
    con = output.console()
    con.print(
        f"from {output.when(reply.start_time)} to {output.when(reply.end_time)} (UTC); queue now: "
        f"{reply.queue.pending} pending, {reply.queue.assigned} assigned, {reply.queue.running} running"
    )
    con.print(output.table("totals", COUNT_COLUMNS, [counts_row(reply.totals)]))
    keys = ("period", *(("caller",) if by_caller else ()), *(("device",) if by_device else ()), "type", "verdict")
    con.print(
        output.table(
            f"{len(reply.buckets)} buckets" + (" (truncated)" if reply.truncated else ""),
            (*keys, *COUNT_COLUMNS),
            (
                (
                    output.when(b.start_time)[:16],
                    *((b.caller,) if by_caller else ()),
                    *((b.device_id,) if by_device else ()),
                    output.task_type(b.type),
                    output.verdict(b.verdict),
                    *counts_row(b.counts),
                )
                for b in reply.buckets
            ),
        )
    )
    if reply.top_words:
        con.print(
            output.table(
                "top words", ("word", "category", "hits"), ((w.word, w.category, w.hits) for w in reply.top_words)
            )
        )
    if reply.top_categories:
        con.print(
            output.table("top categories", ("category", "hits"), ((c.category, c.hits) for c in reply.top_categories))
        )


def _ts(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    return ts


@click.command("stats")
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), help="The last this many hours (hourly).")
@click.option("--days", type=click.FloatRange(min=0, min_open=True), help="The last this many days (daily).")
@click.option("--start", type=click.DateTime(), help="From this time (UTC).")
@click.option("--end", type=click.DateTime(), help="Up to this time (UTC).")
@click.option("--granularity", type=click.Choice(("hour", "day")), help="Period of the buckets (default day).")
@click.option("--device", "-d", help="Only this device.")
@click.option("--type", "task_type", type=click.Choice(TYPES, case_sensitive=False))
@click.option("--caller", help="Operators: only this caller's.")
@click.option("--by-caller", is_flag=True, help="A bucket per caller.")
@click.option("--by-device", is_flag=True, help="A bucket per device.")
@click.option("--top", type=click.IntRange(0, 100), default=0, help="How many top words (0: 10).")
@output_option
@click.pass_obj
def stats_command(
    obj: Obj,
    hours: float | None,
    days: float | None,
    start: datetime | None,
    end: datetime | None,
    granularity: str | None,
    device: str | None,
    task_type: str | None,
    caller: str | None,
    by_caller: bool,
    by_device: bool,
    top: int,
    output_format: str,
) -> None:
    """Statistics of tasks by period, type and verdict: final statuses, processing times, top words, the queue."""
    now = datetime.now(UTC)
    if hours is not None:
        start, granularity = now - timedelta(hours=hours), granularity or "hour"
    elif days is not None:
        start, granularity = now - timedelta(days=days), granularity or "day"
    request = intake_pb2.GetStatsRequest(
        start_time=_ts(start) if start else None,
        end_time=_ts(end) if end else None,
        granularity=intake_pb2.STATS_GRANULARITY_HOUR if granularity == "hour" else intake_pb2.STATS_GRANULARITY_DAY,
        device_id=device or "",
        type=output.task_type_of(task_type),
        caller=caller or "",
        by_caller=by_caller,
        by_device=by_device,
        top=top,
    )

    async def body(client: Client) -> None:
        reply = await client.call("intake", client.intake().GetStats(request, **client.options()))
        if output_format == "json":
            output.print_json(output.to_dict(reply))
        else:
            show_stats(reply, by_caller, by_device)

    run(obj, Role.CLIENT, body)


__all__ = ["list_workers", "stats_command", "worker_row", "workers_command"]
