"""`sieve slots` (the scheduler's slot pools of external providers: holders, lease deadlines, cost per provider and
caller) and `sieve jobs` / `sieve jobs run NAME` (a server's periodic jobs, JobsService; operators)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from sieve.cli import output
from sieve.cli.client import Client
from sieve.cli.config import Role
from sieve.cli.runner import Obj, output_option, run
from sieve.v1 import jobs_pb2, scheduler_pb2

F = TypeVar("F", bound=Callable[..., Any])
SERVICES = ("scheduler", "intake", "registry")


@click.command("slots")
@output_option
@click.pass_obj
def slots_command(obj: Obj, output_format: str) -> None:
    """The slot pools of the external providers: slots in use of the most, who holds them and until when (their
    leases, renewed as the jobs run), and what the jobs cost per provider and caller."""

    async def body(client: Client) -> None:
        reply = await client.call(
            "scheduler", client.scheduler().ListSlotPools(scheduler_pb2.ListSlotPoolsRequest(), **client.options())
        )
        if output_format == "json":
            output.print_json(output.to_dict(reply) | {"pools": [_pool(p) for p in reply.pools]})
            return
        con = output.console()
        now = datetime.now(UTC)
        con.print(
            output.table(
                f"{len(reply.pools)} slot pools",
                ("pool", "in use", "max", "holders"),
                ((p.name, p.in_use, p.max_slots, len(p.holders)) for p in reply.pools),
            )
        )
        holders = [(p.name, h) for p in reply.pools for h in p.holders]
        if holders:
            con.print(
                output.table(
                    "holders",
                    ("pool", "holder", "lease deadline", "left"),
                    (
                        (name, h.holder, output.when(h.lease_deadline), _left(h.lease_deadline.ToDatetime(UTC), now))
                        for name, h in holders
                    ),
                )
            )
        con.print(
            output.table(
                "cost",
                ("provider", "caller", "jobs", "cost"),
                ((c.provider, c.caller, c.jobs, c.cost) for c in reply.costs),
            )
        )

    run(obj, Role.OPERATOR, body)


def _pool(p: scheduler_pb2.SlotPool) -> dict[str, Any]:
    """A pool as JSON, its counts there even when 0 (MessageToDict leaves out zeros)."""
    return {
        "name": p.name,
        "max_slots": p.max_slots,
        "in_use": p.in_use,
        "holders": [{"holder": h.holder, "lease_deadline": output.to_dict(h)["lease_deadline"]} for h in p.holders],
    }


def _left(deadline: datetime, now: datetime) -> str:
    left = (deadline - now).total_seconds()
    return output.seconds(left) if left >= 0 else f"-{output.seconds(-left)} (expired)"


def target_options(fn: F) -> F:
    """--service / --at: whose periodic jobs."""
    fn = click.option(
        "--at", "address", metavar="HOST:PORT", help="Another server's address (a worker's health address)."
    )(fn)
    return click.option(
        "--service",
        "-s",
        type=click.Choice(SERVICES),
        default="scheduler",
        show_default=True,
        help="Whose jobs (at its address of the global options).",
    )(fn)


def _stub(client: Client, service: str, address: str | None) -> tuple[str, Any]:
    if address:
        client.reach("server", address)
        return "server", client.jobs("server")
    return service, client.jobs(service)


def job_row(j: jobs_pb2.Job, now: datetime) -> tuple[object, ...]:
    if j.running:
        state = "running"
    elif j.last_error:
        state = f"failed: {j.last_error}"
    else:
        state = j.last_result or ("-" if not j.runs else "ok")
    return (
        j.name,
        f"{j.service} {j.replica}".strip(),
        output.duration(j.interval),
        j.runs,
        j.errors,
        output.age(j.last_finished_at, now),
        output.duration(j.last_duration) if j.runs else "",
        _left(j.next_run_at.ToDatetime(UTC), now) if j.next_run_at.seconds else "",
        state,
    )


JOB_COLUMNS = ("job", "server", "every", "runs", "errors", "last run", "took", "next in", "last outcome")


def _job(j: jobs_pb2.Job) -> dict[str, Any]:
    """A job as JSON, its counts there even when 0."""
    return output.to_dict(j) | {"runs": j.runs, "errors": j.errors, "consecutive_errors": j.consecutive_errors}


@click.group("jobs", invoke_without_command=True)
@target_options
@output_option
@click.pass_context
def jobs_group(ctx: click.Context, service: str, address: str | None, output_format: str) -> None:
    """A server's periodic jobs (the scheduler's by default): what they do, how often, how their runs went;
    `sieve jobs run NAME` runs one now (operators)."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Obj = ctx.obj

    async def body(client: Client) -> None:
        name, stub = _stub(client, service, address)
        reply = await client.call(name, stub.ListJobs(jobs_pb2.ListJobsRequest(), **client.options()))
        if output_format == "json":
            output.print_json({"jobs": [_job(j) for j in reply.jobs]})
            return
        now = datetime.now(UTC)
        output.console().print(
            output.table(f"{len(reply.jobs)} jobs", JOB_COLUMNS, (job_row(j, now) for j in reply.jobs))
        )

    run(obj, Role.OPERATOR, body)


@jobs_group.command("run")
@click.argument("name")
@target_options
@output_option
@click.pass_obj
def run_command(obj: Obj, name: str, service: str, address: str | None, output_format: str) -> None:
    """Run the job NAME now (or wait for its run in progress); exit 1 when that run failed."""

    async def body(client: Client) -> int:
        target, stub = _stub(client, service, address)
        reply = await client.call(
            target, stub.RunJob(jobs_pb2.RunJobRequest(name=name), **client.options(timeout=False))
        )
        if output_format == "json":
            output.print_json({"succeeded": reply.succeeded, "job": _job(reply.job)})
        elif reply.succeeded:
            output.console().print(
                f"{name}: done in {output.duration(reply.job.last_duration)}: {reply.job.last_result or 'ok'}"
            )
        else:
            output.err_console().print(f"{name}: failed: {reply.job.last_error}")
        return 0 if reply.succeeded else 1

    run(obj, Role.OPERATOR, body)


__all__ = ["jobs_group", "slots_command"]
