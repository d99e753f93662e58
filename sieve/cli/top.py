"""`sieve top`: a live view of the platform for operators — the busiest devices (their open tasks, the wait of the
oldest, their share of the work done), the queues (pending, leased, by priority, dead letters), the workers and
their load, and the throughput.

Each frame is built from four calls made at once: the scheduler's GetWatermark, the registry's ListWorkers, the
intake's GetStats (the last hour, by device) and ListTasks of the open tasks (the newest 1000: the waits and
priorities shown are of those). Throughput is the change in finished tasks between two frames; the first frame
(and `--once`) shows the last hour's rate. `--once` prints one frame and ends (`-o json`: the frame's data).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import click
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from sieve.cli import output
from sieve.cli.client import Client, CliError, ExitCode
from sieve.cli.cluster import WORKER_COLUMNS, worker_row
from sieve.cli.config import Role
from sieve.cli.runner import Obj, output_option, run
from sieve.v1 import intake_pb2, registry_pb2, scheduler_pb2, types_pb2

T = TypeVar("T")
OPEN = (types_pb2.TASK_STATUS_PENDING, types_pb2.TASK_STATUS_ASSIGNED, types_pb2.TASK_STATUS_RUNNING)
#: open tasks read per frame (one page of ListTasks)
OPEN_SAMPLE = 1000


@dataclass
class Device:
    """One device in the frame."""

    device_id: str
    pending: int = 0
    leased: int = 0
    #: seconds its oldest pending task (of the sample) has waited
    oldest_wait_s: float = 0.0
    finished: int = 0
    share: float = 0.0
    flags: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "device_id": self.device_id,
            "pending": self.pending,
            "leased": self.leased,
            "oldest_wait_s": round(self.oldest_wait_s, 3),
            "finished": self.finished,
            "share": round(self.share, 4),
            "flags": self.flags,
        }


@dataclass
class Frame:
    """What one frame shows; a part whose call failed holds its error instead."""

    at: datetime
    watermark: scheduler_pb2.GetWatermarkResponse | None = None
    workers: list[registry_pb2.WorkerInfo] = field(default_factory=list)
    stats: intake_pb2.GetStatsResponse | None = None
    open_tasks: list[types_pb2.Task] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    #: finished tasks per second: between the last two frames, else over the last hour
    throughput: float = 0.0
    throughput_over: str = "since the hour's start"

    def devices(self, limit: int) -> list[Device]:
        devices: dict[str, Device] = {}
        for task in self.open_tasks:
            device = devices.setdefault(task.device_id, Device(task.device_id))
            if task.status == types_pb2.TASK_STATUS_PENDING:
                device.pending += 1
                wait = (self.at - task.created_at.ToDatetime(tzinfo=UTC)).total_seconds()
                device.oldest_wait_s = max(device.oldest_wait_s, wait)
            else:
                device.leased += 1
        total = self.stats.totals.finished if self.stats else 0
        if self.stats:
            for bucket in self.stats.buckets:
                device = devices.setdefault(bucket.device_id, Device(bucket.device_id))
                device.finished += bucket.counts.finished
        for device in devices.values():
            device.share = device.finished / total if total else 0.0
        if self.watermark:
            for device_id in self.watermark.overloaded_devices:
                devices.setdefault(device_id, Device(device_id)).flags.append("overloaded")
            for device_id in self.watermark.backoff_devices:
                devices.setdefault(device_id, Device(device_id)).flags.append("backoff")
        ranked = sorted(devices.values(), key=lambda d: (-(d.pending + d.leased), -d.oldest_wait_s, -d.finished))
        return ranked[:limit]

    def priorities(self) -> dict[str, int]:
        counts = Counter(
            output.name(types_pb2.Priority, t.priority) or "NORMAL"
            for t in self.open_tasks
            if t.status == types_pb2.TASK_STATUS_PENDING
        )
        return dict(sorted(counts.items()))

    def as_dict(self, limit: int) -> dict[str, object]:
        data: dict[str, object] = {
            "at": self.at.isoformat(),
            "throughput_per_s": round(self.throughput, 4),
            "throughput_over": self.throughput_over,
            "devices": [d.as_dict() for d in self.devices(limit)],
            "pending_by_priority": self.priorities(),
            "workers": [output.to_dict(w) for w in self.workers],
            "errors": self.errors,
        }
        if self.watermark:
            data["watermark"] = output.to_dict(self.watermark)
        if self.stats:
            data["queue"] = output.to_dict(self.stats.queue)
            data["finished"] = self.stats.totals.finished
            data["finished_since"] = self.stats.start_time.ToDatetime(tzinfo=UTC).isoformat()
        return data


def _hour_ago(now: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(now - timedelta(hours=1))
    return ts


async def _part(frame: Frame, name: str, pending: Awaitable[T]) -> T | None:
    """The answer of one call, or None with its error in the frame (a bad token ends the command)."""
    try:
        return await pending
    except CliError as exc:
        if exc.code is ExitCode.AUTH:
            raise
        frame.errors[name] = exc.message
        return None


async def read_frame(client: Client) -> Frame:
    frame = Frame(datetime.now(UTC))
    options = client.options()
    watermark, workers, stats, open_tasks = await asyncio.gather(
        _part(
            frame,
            "scheduler",
            client.call("scheduler", client.scheduler().GetWatermark(scheduler_pb2.GetWatermarkRequest(), **options)),
        ),
        _part(
            frame,
            "registry",
            client.call("registry", client.registry().ListWorkers(registry_pb2.ListWorkersRequest(), **options)),
        ),
        _part(
            frame,
            "intake",
            client.call(
                "intake",
                client.intake().GetStats(
                    intake_pb2.GetStatsRequest(
                        start_time=_hour_ago(frame.at),
                        granularity=intake_pb2.STATS_GRANULARITY_HOUR,
                        by_device=True,
                        top=5,
                    ),
                    **options,
                ),
            ),
        ),
        _part(
            frame,
            "intake tasks",
            client.call(
                "intake",
                client.intake().ListTasks(
                    intake_pb2.ListTasksRequest(statuses=list(OPEN), page_size=OPEN_SAMPLE), **options
                ),
            ),
        ),
    )
    if isinstance(watermark, scheduler_pb2.GetWatermarkResponse):
        frame.watermark = watermark
    if isinstance(workers, registry_pb2.ListWorkersResponse):
        frame.workers = sorted(workers.workers, key=lambda w: w.worker_id)
    if isinstance(stats, intake_pb2.GetStatsResponse):
        frame.stats = stats
        span = (frame.at - stats.start_time.ToDatetime(tzinfo=UTC)).total_seconds()
        frame.throughput = stats.totals.finished / span if span > 0 else 0.0
    if isinstance(open_tasks, intake_pb2.ListTasksResponse):
        frame.open_tasks = list(open_tasks.tasks)
    return frame


def render(frame: Frame, limit: int) -> RenderableType:
    parts: list[RenderableType] = [
        Text(
            f"sieve top — {frame.at.strftime('%Y-%m-%d %H:%M:%S')} UTC — throughput {frame.throughput:,.1f} tasks/s"
            f" ({frame.throughput_over})",
            style="bold",
        )
    ]
    w = frame.watermark
    queue = frame.stats.queue if frame.stats else None
    rows: list[tuple[str, object]] = []
    if w is not None:
        rows += [
            ("pending (Redis)", w.total_pending),
            ("leased", w.leased),
            ("active devices", w.active_devices),
            ("live workers", w.live_workers),
            ("oldest wait", output.duration(w.oldest_wait)),
            ("dead letters", w.dead_letters),
        ]
    if queue is not None:
        rows.append(("open tasks", f"{queue.pending} pending, {queue.assigned} assigned, {queue.running} running"))
    priorities = frame.priorities()
    if priorities:
        rows.append(("pending by priority", ", ".join(f"{k} {v}" for k, v in priorities.items())))
    if frame.stats is not None:
        rows.append((f"finished since {output.when(frame.stats.start_time)[11:16]}", frame.stats.totals.finished))
    parts.append(output.table("queues", ("", "now"), rows))
    parts.append(
        output.table(
            "busiest devices",
            ("device", "pending", "leased", "oldest wait", "done", "share", "flags"),
            (
                (
                    d.device_id,
                    d.pending,
                    d.leased,
                    output.seconds(d.oldest_wait_s) if d.pending else "",
                    d.finished,
                    f"{d.share:.1%}",
                    ",".join(d.flags),
                )
                for d in frame.devices(limit)
            ),
        )
    )
    parts.append(
        output.table(f"{len(frame.workers)} workers", WORKER_COLUMNS, (worker_row(x, frame.at) for x in frame.workers))
    )
    for name, message in sorted(frame.errors.items()):
        parts.append(Text(f"{name}: {message}", style="red"))
    return Group(*parts)


class Frames:
    """Successive frames, each with the throughput since the one before."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.last: Frame | None = None
        self.last_at = 0.0

    async def next(self) -> Frame:
        frame = await read_frame(self.client)
        now = time.monotonic()
        if self.last is not None and frame.stats and self.last.stats:
            done = frame.stats.totals.finished - self.last.stats.totals.finished
            frame.throughput, frame.throughput_over = max(done, 0) / (now - self.last_at), "now"
        self.last, self.last_at = frame, now
        return frame


@click.command("top")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds per frame.")
@click.option("--once", is_flag=True, help="Print one frame and end.")
@click.option("--frames", "count", type=click.IntRange(1), help="End after this many frames (default: at Ctrl-C).")
@click.option("--devices", "limit", type=click.IntRange(1, 100), default=10, show_default=True, help="Devices shown.")
@output_option
@click.pass_obj
def top_command(obj: Obj, interval: float, once: bool, count: int | None, limit: int, output_format: str) -> None:
    """A live view: busiest devices, queues, workers and their load, throughput (operators). Ctrl-C ends it.

    On a terminal the view is redrawn in place; to a pipe each frame is printed after the last (`-o json`: one
    JSON object per frame, or one document with --once).
    """
    if once:
        count = 1

    async def body(client: Client) -> int:
        frames = Frames(client)
        frame = await frames.next()
        if once and output_format == "json":
            output.print_json(frame.as_dict(limit))
        con = output.console()
        shown = 0
        on_screen = con.is_terminal and not once and output_format != "json"
        live = Live(render(frame, limit), console=con, auto_refresh=False) if on_screen else None
        with live or contextlib.nullcontext():
            while True:
                if live is not None:
                    live.update(render(frame, limit), refresh=True)
                elif output_format == "json" and not once:
                    output.print_json_line(frame.as_dict(limit))
                elif output_format != "json":
                    con.print(render(frame, limit))
                shown += 1
                if count is not None and shown >= count:
                    return ExitCode.UNAVAILABLE if len(frame.errors) == 4 else ExitCode.OK
                await asyncio.sleep(interval)
                frame = await frames.next()

    run(obj, Role.OPERATOR, body)


__all__ = ["Frame", "Frames", "read_frame", "render", "top_command"]
