"""`sieve dlq ls|requeue|purge`: the scheduler's dead letters (operators)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from sieve.cli import output
from sieve.cli.client import Client
from sieve.cli.config import Role
from sieve.cli.runner import Obj, output_option, run
from sieve.v1 import scheduler_pb2

F = TypeVar("F", bound=Callable[..., Any])
TYPES = ("TEXT", "OCR_IMAGE")


def filter_options(fn: F) -> F:
    """--task, --device, --type, --error: which dead letters (none given: all of them)."""
    for option in reversed(
        (
            click.option("--task", "task_id", help="One task."),
            click.option("--device", "-d", help="One device's."),
            click.option("--type", "task_type", type=click.Choice(TYPES, case_sensitive=False)),
            click.option("--error", "error_contains", help="Those whose error contains this text."),
        )
    ):
        fn = option(fn)
    return fn


def dead_letter_filter(
    task_id: str | None, device: str | None, task_type: str | None, error_contains: str | None
) -> scheduler_pb2.DeadLetterFilter:
    return scheduler_pb2.DeadLetterFilter(
        task_id=task_id or "",
        device_id=device or "",
        type=output.task_type_of(task_type),
        error_contains=error_contains or "",
    )


def _is_empty(f: scheduler_pb2.DeadLetterFilter) -> bool:
    return bool(f == scheduler_pb2.DeadLetterFilter())


@click.group("dlq")
def dlq_group() -> None:
    """Dead letters: tasks given up on after too many attempts (operators)."""


@dlq_group.command("ls")
@filter_options
@click.option("--limit", "-n", type=click.IntRange(1, 1000), default=100, show_default=True)
@output_option
@click.pass_obj
def ls_command(
    obj: Obj,
    task_id: str | None,
    device: str | None,
    task_type: str | None,
    error_contains: str | None,
    limit: int,
    output_format: str,
) -> None:
    """List dead letters, newest first."""
    request = scheduler_pb2.ListDeadLettersRequest(
        filter=dead_letter_filter(task_id, device, task_type, error_contains), limit=limit
    )

    async def body(client: Client) -> None:
        reply = await client.call("scheduler", client.scheduler().ListDeadLetters(request, **client.options()))
        if output_format == "json":
            output.print_json(output.to_dict(reply) | {"total": reply.total})
            return
        output.console().print(
            output.table(
                f"{len(reply.dead_letters)} dead letters (of {reply.total} kept)",
                ("task", "device", "type", "attempts", "dead at", "error"),
                (
                    (d.task_id, d.device_id, output.task_type(d.type), d.attempts, output.when(d.dead_at), d.error)
                    for d in reply.dead_letters
                ),
            )
        )

    run(obj, Role.OPERATOR, body)


@dlq_group.command("requeue")
@filter_options
@click.option("--all", "everything", is_flag=True, help="Every dead letter (required without a filter).")
@output_option
@click.pass_obj
def requeue_command(
    obj: Obj,
    task_id: str | None,
    device: str | None,
    task_type: str | None,
    error_contains: str | None,
    everything: bool,
    output_format: str,
) -> None:
    """Put dead letters back in their device queues (each keeps its id and history)."""
    selected = dead_letter_filter(task_id, device, task_type, error_contains)
    if _is_empty(selected) and not everything:
        raise click.UsageError("give a filter (--task, --device, --type, --error) or --all")

    async def body(client: Client) -> None:
        reply = await client.call(
            "scheduler",
            client.scheduler().RequeueDeadLetters(
                scheduler_pb2.RequeueDeadLettersRequest(filter=selected, all=everything), **client.options()
            ),
        )
        if output_format == "json":
            output.print_json({"requeued": len(reply.task_ids), "task_ids": list(reply.task_ids)})
        else:
            output.console().print(f"requeued {len(reply.task_ids)} tasks")
            for task in reply.task_ids:
                output.console().print(f"  {task}")

    run(obj, Role.OPERATOR, body)


@dlq_group.command("purge")
@filter_options
@click.option("--all", "everything", is_flag=True, help="Every dead letter (required without a filter).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@output_option
@click.pass_obj
def purge_command(
    obj: Obj,
    task_id: str | None,
    device: str | None,
    task_type: str | None,
    error_contains: str | None,
    everything: bool,
    yes: bool,
    output_format: str,
) -> None:
    """Forget dead letters (their tasks stay DEAD_LETTERED in the record)."""
    selected = dead_letter_filter(task_id, device, task_type, error_contains)
    if _is_empty(selected) and not everything:
        raise click.UsageError("give a filter (--task, --device, --type, --error) or --all")
    if not yes and not click.confirm("forget the matching dead letters?", err=True):
        raise click.Abort

    async def body(client: Client) -> None:
        reply = await client.call(
            "scheduler",
            client.scheduler().PurgeDeadLetters(
                scheduler_pb2.PurgeDeadLettersRequest(filter=selected, all=everything), **client.options()
            ),
        )
        if output_format == "json":
            output.print_json({"purged": reply.purged})
        else:
            output.console().print(f"purged {reply.purged} dead letters")

    run(obj, Role.OPERATOR, body)


__all__ = ["dlq_group"]
