"""`sieve submit`: texts and images to tasks, a progress bar with rate and ETA, and a summary of what came of them.

Items go in SubmitBatch calls (`--batch-size` items, at most 12 MiB each), `--concurrency` calls at a time. A
refusal over a limit (RESOURCE_EXHAUSTED) is tried again after the retry_after the intake gave, at most
`--retry-wait-max` (5 s: the intake advises its whole SIEVE_RETRY_AFTER_S, 30 s, for a device whose service rate it
has not measured yet — one just starting to be served), for up to `--retry-for` seconds; a batch refused whole
over a limit twice, larger than any accepted, is split in halves; a batch the intake refuses for one bad item
(INVALID_ARGUMENT) is sent again item by item, so that only the bad one is refused. With `--wait` the command then
follows every accepted task to its end over WatchTask (GetTask polling where a stream cannot be had) and shows the
verdicts.

Exit status: 0 when every item was accepted (and, with --wait, every task SUCCEEDED), 1 otherwise; an error of
the whole command (a bad token, an unreachable intake) has its own code (sieve.cli.client.ExitCode).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import click
import grpc

from sieve.cli import output, waiting
from sieve.cli.client import Client, CliError, ExitCode
from sieve.cli.config import Role
from sieve.cli.inputs import Item, batches, image_paths, images, texts
from sieve.cli.progress import progress_bar
from sieve.cli.runner import Obj, labels_option, output_option, parse_labels, run
from sieve.v1 import intake_pb2, types_pb2

#: payload bytes in one SubmitBatch call (under the 16 MiB message limit, with room for the rest)
BATCH_BYTES = 12 * 1024 * 1024
PRIORITIES = ("BACKGROUND", "LOW", "NORMAL", "HIGH", "CRITICAL")


@dataclass
class Outcome:
    """What came of one item."""

    item: Item
    task_id: str = ""
    deduplicated: bool = False
    #: the refusal's gRPC status name and message ("" when accepted)
    refused: str = ""
    message: str = ""
    #: with --wait: the final status, verdict and detail
    status: str = ""
    verdict: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"source": self.item.source, "idempotency_key": self.item.key}
        if self.task_id:
            data.update(task_id=self.task_id, deduplicated=self.deduplicated)
        if self.refused:
            data.update(refused=self.refused, message=self.message)
        if self.status:
            data["status"] = self.status
        if self.verdict:
            data["verdict"] = self.verdict
        if self.detail:
            data["detail"] = self.detail
        return data


@dataclass(frozen=True)
class Spec:
    """What every task of this submit shares."""

    device: str
    priority: types_pb2.Priority
    labels: dict[str, str]
    max_attempts: int

    def task(self, item: Item) -> intake_pb2.TaskSpec:
        spec = intake_pb2.TaskSpec(
            device_id=self.device,
            priority=self.priority,
            idempotency_key=item.key,
            labels=self.labels,
            max_attempts=self.max_attempts,
        )
        if item.image is not None:
            spec.type = types_pb2.TASK_TYPE_OCR_IMAGE
            spec.image = item.image
        else:
            spec.type = types_pb2.TASK_TYPE_TEXT
            spec.text = item.text or ""
        return spec


class Submitter:
    """Sends the batches, `concurrency` at a time, and records each item's outcome."""

    def __init__(
        self,
        client: Client,
        spec: Spec,
        concurrency: int,
        retry: tuple[float, float],
        advance: Callable[[int], None],
    ) -> None:
        self.client = client
        self.spec = spec
        self.gate = asyncio.Semaphore(concurrency)
        #: how long to keep retrying refusals over a limit, and the longest wait between two tries
        self.retry_for_s, self.retry_wait_max_s = retry
        self.advance = advance
        #: the most items one call got accepted: a batch refused whole that is no larger is sent again as it is
        self.fits = 0

    async def batch(self, outcomes: Sequence[Outcome], deadline: float | None = None) -> None:
        """Sends `outcomes`' items until each is accepted or refused for good. Items refused over a limit are sent
        again after the retry_after the intake gave; a batch refused whole (more than the device may have pending at
        once, say: refused twice, and larger than any batch accepted so far) is sent again in halves, and one refused
        for a bad item (INVALID_ARGUMENT) item by item."""
        deadline = time.monotonic() + self.retry_for_s if deadline is None else deadline
        todo = list(outcomes)
        refused_whole = 0
        while todo:
            async with self.gate:
                try:
                    reply = await self.client.call(
                        "intake",
                        self.client.intake().SubmitBatch(
                            intake_pb2.SubmitBatchRequest(tasks=[self.spec.task(o.item) for o in todo]),
                            **self.client.options(),
                        ),
                    )
                except CliError as exc:
                    if exc.code is not ExitCode.USAGE:
                        raise
                    reply = None
                    if len(todo) == 1:
                        todo[0].refused, todo[0].message = exc.status, exc.details
                        self.advance(1)
                        return
            if reply is None:  # which item is bad: each alone
                await asyncio.gather(*(self.batch([o], deadline) for o in todo))
                return
            retry: list[Outcome] = []
            wait_s = 0.0
            for outcome, item in zip(todo, reply.items, strict=True):
                if item.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and time.monotonic() < deadline:
                    retry.append(outcome)
                    wait_s = max(wait_s, item.retry_after.ToTimedelta().total_seconds())
                    continue
                record(outcome, item)
            self.advance(len(todo) - len(retry))
            self.fits = max(self.fits, len(todo) - len(retry))
            refused_whole = refused_whole + 1 if len(retry) == len(todo) else 0
            if retry:
                wait_s = min(wait_s, self.retry_wait_max_s, deadline - time.monotonic())
                await asyncio.sleep(max(wait_s, 0.05))
            if len(retry) > 1 and refused_whole >= 2 and len(retry) > self.fits:
                half = len(retry) // 2
                await asyncio.gather(self.batch(retry[:half], deadline), self.batch(retry[half:], deadline))
                return
            todo = retry


def record(outcome: Outcome, item: intake_pb2.SubmitBatchItem) -> None:
    if item.code == 0:
        outcome.task_id, outcome.deduplicated = item.task.task_id, item.deduplicated
    else:
        outcome.refused = _code_name(item.code)
        outcome.message = item.message


def _code_name(code: int) -> str:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status.name
    return str(code)


async def submit_all(
    client: Client,
    spec: Spec,
    items: list[Item],
    *,
    batch_size: int,
    concurrency: int,
    retry: tuple[float, float],
    show: bool,
) -> list[Outcome]:
    outcomes = [Outcome(item) for item in items]
    groups: list[list[Outcome]] = []
    start = 0
    for group in batches(items, batch_size, BATCH_BYTES):
        groups.append(outcomes[start : start + len(group)])
        start += len(group)
    with progress_bar("submitting", len(items), show) as advance:
        submitter = Submitter(client, spec, concurrency, retry, advance)
        await asyncio.gather(*(submitter.batch(group) for group in groups))
    return outcomes


def summary(outcomes: list[Outcome], waited: bool, elapsed_s: float) -> dict[str, object]:
    accepted = [o for o in outcomes if o.task_id]
    data: dict[str, object] = {
        "items": len(outcomes),
        "accepted": len(accepted),
        "deduplicated": sum(o.deduplicated for o in outcomes),
        "refused": len(outcomes) - len(accepted),
        "elapsed_s": round(elapsed_s, 3),
        "rate_per_s": round(len(outcomes) / elapsed_s, 1) if elapsed_s > 0 else None,
    }
    if waited:
        data["statuses"] = dict(Counter(o.status or "OPEN" for o in accepted))
        data["verdicts"] = dict(Counter(o.verdict for o in accepted if o.verdict))
    data["results"] = [o.as_dict() for o in outcomes]
    return data


def show_summary(data: dict[str, object], outcomes: list[Outcome], waited: bool) -> None:
    con = output.console()
    rows: list[tuple[str, object]] = [
        ("items", data["items"]),
        ("accepted", data["accepted"]),
        ("  of them deduplicated", data["deduplicated"]),
        ("refused", data["refused"]),
    ]
    if waited:
        statuses = data["statuses"]
        verdicts = data["verdicts"]
        assert isinstance(statuses, dict) and isinstance(verdicts, dict)
        rows += [(f"status {k}", v) for k, v in sorted(statuses.items())]
        rows += [(f"verdict {k}", v) for k, v in sorted(verdicts.items())]
    rows.append(("time", output.seconds(float(str(data["elapsed_s"])))))
    con.print(output.table("submitted", ("", "count"), rows))
    failures = [o for o in outcomes if o.refused or (waited and o.status and o.status != "SUCCEEDED")]
    if failures:
        shown = failures[:50]
        title = "failures" + (f" (first {len(shown)} of {len(failures)})" if len(failures) > len(shown) else "")
        con.print(
            output.table(
                title,
                ("source", "task", "what", "message"),
                ((o.item.source, o.task_id, o.refused or o.status, o.message or o.detail) for o in shown),
            )
        )
    if waited and not failures:
        blocked = [o for o in outcomes if o.verdict in ("BLOCK", "REVIEW")]
        if blocked:
            con.print(
                output.table(
                    "not passed",
                    ("source", "task", "verdict"),
                    ((o.item.source, o.task_id, o.verdict) for o in blocked),
                )
            )


@click.command("submit")
@click.argument("text", nargs=-1)
@click.option("--device", "-d", required=True, help="The device (MAC address) the tasks are for.")
@click.option("--file", "-f", "files", multiple=True, help="A file whose non-empty lines are texts ('-': stdin).")
@click.option(
    "--image", "-i", "image_patterns", multiple=True, help="An image file, a directory of them, or a glob ('**/*.png')."
)
@click.option("--priority", type=click.Choice(PRIORITIES, case_sensitive=False), default="NORMAL", show_default=True)
@labels_option
@click.option("--max-attempts", type=click.IntRange(0), default=0, help="Attempts before dead-lettering (0: global).")
@click.option("--concurrency", "-c", type=click.IntRange(1, 64), default=4, show_default=True, help="Calls at once.")
@click.option("--batch-size", type=click.IntRange(1, 1000), default=100, show_default=True, help="Items per call.")
@click.option("--key-prefix", default="cli", show_default=True, help="Prefix of the idempotency keys.")
@click.option("--no-idempotency", is_flag=True, help="Send no idempotency keys (every run makes new tasks).")
@click.option(
    "--retry-for", type=float, default=120.0, show_default=True, help="Seconds to retry refusals over a limit."
)
@click.option(
    "--retry-wait-max",
    type=click.FloatRange(min=0.05),
    default=5.0,
    show_default=True,
    help="Longest wait before a retry, whatever retry_after the intake said.",
)
@click.option("--wait", "-w", is_flag=True, help="Follow every task to its end, then show the verdicts.")
@click.option("--wait-timeout", type=float, default=600.0, show_default=True, help="Seconds --wait waits at most.")
@click.option("--no-progress", is_flag=True, help="No progress bars (on stderr).")
@output_option
@click.pass_obj
def submit_command(
    obj: Obj,
    text: tuple[str, ...],
    device: str,
    files: tuple[str, ...],
    image_patterns: tuple[str, ...],
    priority: str,
    labels: tuple[str, ...],
    max_attempts: int,
    concurrency: int,
    batch_size: int,
    key_prefix: str,
    no_idempotency: bool,
    retry_for: float,
    retry_wait_max: float,
    wait: bool,
    wait_timeout: float,
    no_progress: bool,
    output_format: str,
) -> None:
    """Submit texts (arguments, lines of --file) and images (--image) for DEVICE's detection.

    \b
    sieve submit -d AA-BB-CC-DD-EE-01 "加 微 信 免费领取" "hello"
    sieve submit -d AA-BB-CC-DD-EE-01 -f messages.txt --wait
    sieve submit -d AA-BB-CC-DD-EE-01 -i scans/ -i 'photos/**/*.jpg' --concurrency 8 --wait
    """
    prefix = None if no_idempotency else key_prefix
    spec = Spec(device, output.priority_of(priority), parse_labels(labels), max_attempts)
    show = not no_progress

    async def body(client: Client) -> int:
        items = [*texts(text, files, prefix), *images(image_paths(image_patterns), prefix)]
        if not items:
            raise CliError("nothing to submit: give texts, --file or --image", ExitCode.USAGE)
        started = time.monotonic()
        outcomes = await submit_all(
            client,
            spec,
            items,
            batch_size=batch_size,
            concurrency=concurrency,
            retry=(retry_for, retry_wait_max),
            show=show,
        )
        if wait:
            await waiting.follow(client, outcomes, timeout_s=wait_timeout, show=show)
        data = summary(outcomes, wait, time.monotonic() - started)
        if output_format == "json":
            output.print_json(data)
        else:
            show_summary(data, outcomes, wait)
        failed = any(o.refused or (wait and o.status != "SUCCEEDED") for o in outcomes)
        return ExitCode.ERROR if failed else ExitCode.OK

    run(obj, Role.CLIENT, body)


__all__ = ["Outcome", "Spec", "submit_all", "submit_command"]
