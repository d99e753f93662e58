"""`sieve get`, `sieve watch`, `sieve ls`: one task, its changes as they happen, and the list of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
from google.protobuf.timestamp_pb2 import Timestamp

from sieve.cli import output
from sieve.cli.client import Client
from sieve.cli.config import Role
from sieve.cli.runner import Obj, labels_option, output_option, parse_labels, run
from sieve.cli.waiting import FINAL
from sieve.v1 import intake_pb2, types_pb2

STATUSES = ("PENDING", "ASSIGNED", "RUNNING", "SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED", "DEAD_LETTERED")
TYPES = ("TEXT", "OCR_IMAGE")
VERDICTS = ("PASS", "REVIEW", "BLOCK")


def enum_choice(values: tuple[str, ...]) -> click.Choice[str]:
    return click.Choice(values, case_sensitive=False)


def show_task(task: types_pb2.Task) -> None:
    con = output.console()
    rows: list[tuple[str, object]] = [
        ("task", task.task_id),
        ("device", task.device_id),
        ("type", output.task_type(task.type)),
        ("priority", output.name(types_pb2.Priority, task.priority)),
        ("status", output.status(task.status)),
        ("attempts", task.attempts),
        ("created", output.when(task.created_at)),
        ("updated", output.when(task.updated_at)),
        ("expires", output.when(task.expires_at)),
    ]
    if task.labels:
        rows.append(("labels", output.labels(task.labels)))
    if task.idempotency_key:
        rows.append(("idempotency key", task.idempotency_key))
    if task.error:
        rows.append(("error", task.error))
    if task.HasField("result"):
        result = task.result
        rows += [
            ("verdict", output.verdict(result.verdict)),
            ("text", result.text),
            ("worker", result.worker_id),
            ("processing", f"{result.processing_time_ms:.1f}ms"),
            ("lexicon version", result.lexicon_version),
        ]
    con.print(output.table(None, ("field", "value"), rows))
    if task.result.hits:
        con.print(
            output.table(
                "hits",
                ("word", "category", "severity", "at", "matched"),
                ((h.word, h.category, h.severity, f"{h.start}-{h.end}", h.matched_text) for h in task.result.hits),
            )
        )
    if task.result.lines:
        con.print(
            output.table(
                "lines read",
                ("line", "text", "confidence"),
                ((n, line.text, f"{line.confidence:.2f}") for n, line in enumerate(task.result.lines)),
            )
        )
    if task.result.HasField("ocr"):
        ocr = task.result.ocr
        image = f"{ocr.image_format} {ocr.image_width}x{ocr.image_height}"
        con.print(f"ocr: {ocr.engine}, {ocr.mode} on {ocr.device}, {image}, {ocr.boxes_found} boxes")
    if task.history:
        con.print(
            output.table(
                "history",
                ("at", "status", "attempt", "detail"),
                ((output.when(c.at), output.status(c.status), c.attempt, c.detail) for c in task.history),
            )
        )


@click.command("get")
@click.argument("task_id")
@output_option
@click.pass_obj
def get_command(obj: Obj, task_id: str, output_format: str) -> None:
    """Show task TASK_ID: its status, result, hits and history."""

    async def body(client: Client) -> None:
        reply = await client.call(
            "intake", client.intake().GetTask(intake_pb2.GetTaskRequest(task_id=task_id), **client.options())
        )
        if output_format == "json":
            output.print_json(output.to_dict(reply.task))
        else:
            show_task(reply.task)

    run(obj, Role.CLIENT, body)


@click.command("watch")
@click.argument("task_ids", nargs=-1)
@click.option("--device", "-d", help="Only this device's tasks (watching all of them).")
@labels_option
@click.option("--caller", help="Operators: only this caller's tasks.")
@click.option("--cursor", help="Resume after this change (a change's cursor).")
@click.option("--count", "-n", type=click.IntRange(1), help="Stop after this many changes.")
@output_option
@click.pass_obj
def watch_command(
    obj: Obj,
    task_ids: tuple[str, ...],
    device: str | None,
    labels: tuple[str, ...],
    caller: str | None,
    cursor: str | None,
    count: int | None,
    output_format: str,
) -> None:
    """Print the status changes of TASK_IDS as they happen (their current status first) until each is final; with
    no ids, every change of your tasks (filtered by --device / --label) until interrupted or --count. `-o json`
    prints one JSON object per change."""
    request = intake_pb2.WatchTaskRequest(
        task_ids=list(task_ids),
        device_id=device or "",
        labels=parse_labels(labels),
        caller=caller or "",
        cursor=cursor or "",
        initial_state=bool(task_ids) and not cursor,
    )

    async def body(client: Client) -> None:
        open_ids = set(task_ids)
        seen = 0
        con = output.console()
        call = client.intake().WatchTask(request, **client.options(timeout=False))
        try:
            async for reply in client.stream("intake", call):
                for change in reply.changes:
                    seen += 1
                    if output_format == "json":
                        output.print_json_line(output.to_dict(change))
                    else:
                        verdict = output.verdict(change.verdict)
                        con.print(
                            f"{output.when(change.at)}  {change.task_id}  {change.device_id}  "
                            f"{output.status(change.status)}{' ' + verdict if verdict else ''}"
                            f"  attempt {change.attempt}{'  ' + change.detail if change.detail else ''}"
                        )
                    if change.status in FINAL:
                        open_ids.discard(change.task_id)
                    if count is not None and seen >= count:
                        return
                if task_ids and not open_ids:
                    return
        finally:
            call.cancel()

    run(obj, Role.CLIENT, body)


def _timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    return ts


@click.command("ls")
@click.option("--device", "-d", help="Only this device's tasks.")
@click.option("--status", "-s", "statuses", multiple=True, type=enum_choice(STATUSES), help="Any of these statuses.")
@click.option("--type", "task_type", type=enum_choice(TYPES))
@click.option("--verdict", type=enum_choice(VERDICTS))
@labels_option
@click.option("--since", type=float, help="Created in the last this many minutes.")
@click.option("--after", type=click.DateTime(), help="Created at or after this time (UTC).")
@click.option("--before", type=click.DateTime(), help="Created before this time (UTC).")
@click.option("--caller", help="Operators: only this caller's tasks.")
@click.option("--limit", "-n", type=click.IntRange(1), default=50, show_default=True, help="At most this many.")
@click.option("--page-token", help="Go on from a previous listing's next_page_token.")
@output_option
@click.pass_obj
def ls_command(
    obj: Obj,
    device: str | None,
    statuses: tuple[str, ...],
    task_type: str | None,
    verdict: str | None,
    labels: tuple[str, ...],
    since: float | None,
    after: datetime | None,
    before: datetime | None,
    caller: str | None,
    limit: int,
    page_token: str | None,
    output_format: str,
) -> None:
    """List tasks, newest first (yours; an operator's: everyone's)."""
    if since is not None:
        after = datetime.now(UTC) - timedelta(minutes=since)
    request = intake_pb2.ListTasksRequest(
        device_id=device or "",
        statuses=[output.status_of(s) for s in statuses],
        type=output.task_type_of(task_type),
        verdict=output.verdict_of(verdict),
        labels=parse_labels(labels),
        created_after=_timestamp(after),
        created_before=_timestamp(before),
        caller=caller or "",
        page_token=page_token or "",
    )

    async def body(client: Client) -> None:
        tasks: list[types_pb2.Task] = []
        token = request.page_token
        while len(tasks) < limit:
            request.page_size = min(1000, limit - len(tasks))
            request.page_token = token
            reply = await client.call("intake", client.intake().ListTasks(request, **client.options()))
            tasks.extend(reply.tasks)
            token = reply.next_page_token
            if not token:
                break
        if output_format == "json":
            output.print_json({"tasks": [output.to_dict(t) for t in tasks], "next_page_token": token})
            return
        output.console().print(
            output.table(
                f"{len(tasks)} tasks",
                ("task", "device", "type", "status", "verdict", "created", "labels"),
                (
                    (
                        t.task_id,
                        t.device_id,
                        output.task_type(t.type),
                        output.status(t.status),
                        output.verdict(t.result.verdict),
                        output.when(t.created_at),
                        output.labels(t.labels),
                    )
                    for t in tasks
                ),
            )
        )
        if token:
            output.console().print(f"more: --page-token {token}")

    run(obj, Role.CLIENT, body)


@click.command("cancel")
@click.argument("task_id")
@output_option
@click.pass_obj
def cancel_command(obj: Obj, task_id: str, output_format: str) -> None:
    """Cancel task TASK_ID if it has not finished yet."""

    async def body(client: Client) -> None:
        reply = await client.call(
            "intake", client.intake().CancelTask(intake_pb2.CancelTaskRequest(task_id=task_id), **client.options())
        )
        if output_format == "json":
            output.print_json(output.to_dict(reply.task))
        else:
            output.console().print(f"{reply.task.task_id}: {output.status(reply.task.status)}")

    run(obj, Role.CLIENT, body)


__all__ = ["cancel_command", "get_command", "ls_command", "watch_command"]
