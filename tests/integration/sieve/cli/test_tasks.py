"""`sieve submit`, `get`, `cancel`, `watch` and `ls` against the real services of one test (registry, scheduler,
intake on loopback, a real text worker; real Redis and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve.cli import waiting
from sieve.cli.client import Client
from sieve.cli.config import CliConfig, Role
from sieve.cli.inputs import Item
from sieve.cli.submit import Outcome
from sieve.settings import Settings
from sieve.v1 import intake_pb2
from tests.integration.conftest import Platform, platform_with
from tests.integration.sieve.cli.conftest import Sieve, json_of

DEVICE = "AA-BB-CC-DD-EE-01"
BAD = "加 微 信 免费领取"


async def test_submit_texts_with_wait_shows_the_verdicts_and_a_second_run_returns_the_same_tasks(
    platform: Platform, sieve: Sieve
) -> None:
    # When two texts are submitted and followed to their end
    result = await sieve(platform.settings, "submit", "-d", DEVICE, BAD, "hello there", "--wait")
    # Then the summary table shows both accepted and succeeded, and the verdicts
    assert result.exit_code == 0, result.output
    assert "accepted" in result.stdout and "status SUCCEEDED" in result.stdout and "verdict PASS" in result.stdout
    assert "submitting" in result.stderr and "waiting" in result.stderr  # the progress bars
    # And in JSON, each item has its task and verdict
    again = json_of(await sieve(platform.settings, "submit", "-d", DEVICE, BAD, "hello there", "--wait", "-o", "json"))
    assert again["accepted"] == 2 and again["deduplicated"] == 2 and again["refused"] == 0
    assert again["statuses"] == {"SUCCEEDED": 2}
    verdicts = {r["source"]: r["verdict"] for r in again["results"]}
    assert verdicts["hello there"] == "PASS" and verdicts[BAD] in ("BLOCK", "REVIEW")
    assert all(r["idempotency_key"].startswith("cli:text:") for r in again["results"])


async def test_submit_lines_of_a_file_in_concurrent_batches(platform: Platform, sieve: Sieve, tmp_path: Path) -> None:
    lines = tmp_path / "texts.txt"
    lines.write_text("".join(f"message number {n}\n\n" for n in range(30)))
    data = json_of(
        await sieve(
            platform.settings,
            "submit",
            "-d",
            DEVICE,
            "-f",
            str(lines),
            "--batch-size",
            "4",
            "--concurrency",
            "3",
            "--label",
            "run=file",
            "--wait",
            "-o",
            "json",
        )
    )
    assert data["items"] == 30 and data["accepted"] == 30 and data["statuses"] == {"SUCCEEDED": 30}
    assert {r["source"] for r in data["results"]} == {f"{lines}:{2 * n + 1}" for n in range(30)}
    assert len({r["task_id"] for r in data["results"]}) == 30
    # stdin works as a file too, and --label filters the listing
    listed = json_of(await sieve(platform.settings, "ls", "-l", "run=file", "-n", "100", "-o", "json"))
    assert len(listed["tasks"]) == 30
    piped = json_of(await sieve(platform.settings, "submit", "-d", DEVICE, "-f", "-", "-o", "json", stdin="one\ntwo\n"))
    assert piped["accepted"] == 2


async def test_a_refused_item_is_reported_alone_and_the_command_fails(platform: Platform, sieve: Sieve) -> None:
    # Given a batch with one text over the intake's limit (the whole batch is refused; the command sends each alone)
    # (the long text from stdin: an argument that long is more than a process may be given)
    long = "x" * 200_000 + "\n"
    result = await sieve(platform.settings, "submit", "-d", DEVICE, "fine", "-f", "-", "-o", "json", stdin=long)
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["accepted"] == 1 and data["refused"] == 1
    [refused] = [r for r in data["results"] if "refused" in r]
    assert refused["refused"] == "INVALID_ARGUMENT" and "text" in refused["message"]
    table = await sieve(platform.settings, "submit", "-d", DEVICE, "fine", "-f", "-", stdin=long)
    assert table.exit_code == 1 and "failures" in table.stdout and "INVALID_ARGUMENT" in table.stdout
    # the same text (the same key) with other labels is another request: refused as a conflict, beside a bad item
    result = await sieve(platform.settings, "submit", "-d", DEVICE, "fine", "", "-l", "run=2", "-o", "json")
    assert result.exit_code == 1
    refusals = {r["source"]: r["refused"] for r in json.loads(result.stdout)["results"]}
    assert refusals == {"fine": "ALREADY_EXISTS", "": "INVALID_ARGUMENT"}


async def test_get_shows_a_task_and_its_result(platform: Platform, sieve: Sieve) -> None:
    data = json_of(await sieve(platform.settings, "submit", "-d", DEVICE, BAD, "--wait", "-o", "json"))
    task_id = data["results"][0]["task_id"]
    table = await sieve(platform.settings, "get", task_id)
    assert table.exit_code == 0, table.output
    assert task_id in table.stdout and "SUCCEEDED" in table.stdout and "history" in table.stdout
    assert "hits" in table.stdout and "AA:BB:CC:DD:EE:01" in table.stdout
    task = json_of(await sieve(platform.settings, "get", task_id, "-o", "json"))
    assert task["task_id"] == task_id and task["status"] == "TASK_STATUS_SUCCEEDED"
    assert task["result"]["hits"] and task["result"]["text"] == BAD
    # an unknown task is exit 3, a malformed id exit 2, each in one clean line
    missing = await sieve(platform.settings, "get", str(uuid.uuid4()))
    assert missing.exit_code == 3 and "not found" in missing.stderr and "Traceback" not in missing.output
    malformed = await sieve(platform.settings, "get", "not-an-id")
    assert malformed.exit_code == 2 and "task_id" in malformed.stderr


async def test_watch_follows_tasks_to_their_end_and_resumes_from_a_cursor(
    platform_without_workers: Platform, sieve: Sieve
) -> None:
    p = platform_without_workers
    data = json_of(await sieve(p.settings, "submit", "-d", DEVICE, "one", "two", "-o", "json", "--no-progress"))
    ids = [r["task_id"] for r in data["results"]]
    # Given two pending tasks (no worker yet): their current status first, each with a cursor
    first = await sieve(p.settings, "watch", *ids, "-n", "2", "-o", "json")
    assert first.exit_code == 0, first.output
    pending = [json.loads(line) for line in first.stdout.splitlines()]
    assert [c["status"] for c in pending] == ["TASK_STATUS_PENDING"] * 2 and all(c["cursor"] for c in pending)
    # When a worker runs them, watching the ids ends once both are final
    await p.add_worker(worker_id="worker-1")
    lines = await sieve(p.settings, "watch", *ids, "-o", "json")
    assert lines.exit_code == 0, lines.output
    changes = [json.loads(line) for line in lines.stdout.splitlines()]
    assert {c["task_id"] for c in changes if c["status"] == "TASK_STATUS_SUCCEEDED"} == set(ids)
    table = await sieve(p.settings, "watch", ids[0])
    assert table.exit_code == 0 and "SUCCEEDED PASS" in table.stdout
    # And everything of the device from the first cursor on: the changes after it, up to a count
    resumed = await sieve(p.settings, "watch", "-d", DEVICE, "--cursor", pending[0]["cursor"], "-n", "3", "-o", "json")
    assert resumed.exit_code == 0, resumed.output
    after = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert len(after) == 3 and all(c["status"] != "TASK_STATUS_PENDING" for c in after)


async def test_cancel_a_pending_task(platform_without_workers: Platform, sieve: Sieve) -> None:
    p = platform_without_workers
    data = json_of(await sieve(p.settings, "submit", "-d", DEVICE, "waits", "-o", "json"))
    task_id = data["results"][0]["task_id"]
    cancelled = await sieve(p.settings, "cancel", task_id)
    assert cancelled.exit_code == 0 and "CANCELLED" in cancelled.stdout
    # --wait ends at once for a task that is final, and the command fails: it did not succeed
    waited = await sieve(p.settings, "submit", "-d", DEVICE, "waits", "--wait", "-o", "json")
    assert waited.exit_code == 1 and json.loads(waited.stdout)["statuses"] == {"CANCELLED": 1}


async def test_ls_filters_and_pages(platform: Platform, sieve: Sieve) -> None:
    other = "AA-BB-CC-DD-EE-02"
    json_of(await sieve(platform.settings, "submit", "-d", DEVICE, BAD, "a", "b", "--wait", "-o", "json"))
    json_of(await sieve(platform.settings, "submit", "-d", other, "c", "--wait", "-o", "json"))
    everything = json_of(await sieve(platform.settings, "ls", "-o", "json"))
    assert len(everything["tasks"]) == 4 and not everything["next_page_token"]
    mine = json_of(await sieve(platform.settings, "ls", "-d", other, "-o", "json"))
    assert [t["device_id"] for t in mine["tasks"]] == ["AA:BB:CC:DD:EE:02"]
    passed = json_of(await sieve(platform.settings, "ls", "--verdict", "pass", "-s", "SUCCEEDED", "-o", "json"))
    assert len(passed["tasks"]) == 3
    assert json_of(await sieve(platform.settings, "ls", "--status", "pending", "-o", "json"))["tasks"] == []
    recent = json_of(await sieve(platform.settings, "ls", "--since", "5", "--type", "text", "-o", "json"))
    assert len(recent["tasks"]) == 4
    # a page of 3, then the rest from its token
    first = json_of(await sieve(platform.settings, "ls", "-n", "3", "-o", "json"))
    assert len(first["tasks"]) == 3 and first["next_page_token"]
    rest = json_of(await sieve(platform.settings, "ls", "--page-token", first["next_page_token"], "-o", "json"))
    assert len(rest["tasks"]) == 1
    table = await sieve(platform.settings, "ls", "-n", "3")
    assert table.exit_code == 0 and "3 tasks" in table.stdout and "more: --page-token" in table.stdout


async def test_refusals_over_the_device_limit_are_retried_after_the_time_the_intake_gives(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve
) -> None:
    async with platform_with(settings, redis, pg, workers=1, max_per_device_pending=5, retry_after_s=0.5) as p:
        # Given a device allowed 5 pending tasks, 40 texts in batches of 20 are all accepted in the end (a batch over
        # the limit is refused whole: it is split)
        texts = [f"limited {n}" for n in range(40)]
        data = json_of(
            await sieve(p.settings, "submit", "-d", DEVICE, *texts, "--batch-size", "20", "--wait", "-o", "json")
        )
        assert data["accepted"] == 40 and data["refused"] == 0 and data["statuses"] == {"SUCCEEDED": 40}
    async with platform_with(settings, redis, pg, workers=0, max_per_device_pending=5) as p:
        # without a worker, and without retrying, a batch over the limit is refused
        result = await sieve(
            p.settings,
            "submit",
            "-d",
            DEVICE,
            *(f"unserved {n}" for n in range(8)),
            "--retry-for",
            "0",
            "--batch-size",
            "5",
            "-c",
            "1",
            "-o",
            "json",
        )
        assert result.exit_code == 1, result.stdout
        data = json.loads(result.stdout)
        assert data["accepted"] == 5 and data["refused"] == 3
        assert {r["refused"] for r in data["results"] if "refused" in r} == {"RESOURCE_EXHAUSTED"}


async def test_wait_polls_get_task_when_the_intake_refuses_another_stream(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve
) -> None:
    async with platform_with(settings, redis, pg, workers=1, watch_max_streams_per_caller=1) as p:
        # Given the caller's one stream already open
        held = p.intake.WatchTask(intake_pb2.WatchTaskRequest())
        first = asyncio.ensure_future(held.read())
        await asyncio.sleep(0.3)
        try:
            # When it submits with --wait, its WatchTask is refused (RESOURCE_EXHAUSTED): it polls GetTask instead
            data = json_of(await sieve(p.settings, "submit", "-d", DEVICE, BAD, "polled", "--wait", "-o", "json"))
        finally:
            held.cancel()
            first.cancel()
        assert data["statuses"] == {"SUCCEEDED": 2}
        verdicts = {r["source"]: r["verdict"] for r in data["results"]}
        assert verdicts["polled"] == "PASS" and verdicts[BAD] in ("BLOCK", "REVIEW")


async def test_wait_follows_more_tasks_than_one_stream_takes(
    platform: Platform, sieve: Sieve, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 11 submitted tasks, and streams of at most 3 task ids, 2 at a time (1000 and 4 in use)
    texts = [f"chunked {n}" for n in range(11)]
    data = json_of(await sieve(platform.settings, "submit", "-d", DEVICE, *texts, "-o", "json", "--no-progress"))
    monkeypatch.setattr(waiting, "WATCH_IDS", 3)
    monkeypatch.setattr(waiting, "STREAMS", 2)
    outcomes = [Outcome(Item(r["source"]), task_id=r["task_id"]) for r in data["results"]]
    # When the command's follow() waits for them (here, in the test's own event loop)
    config = CliConfig(intake=platform.settings.intake_addr)
    async with Client(config, Role.CLIENT) as client:
        await waiting.follow(client, outcomes, timeout_s=30, show=False)
    # Then every one is seen to its end, with its verdict
    assert [(o.status, o.verdict) for o in outcomes] == [("SUCCEEDED", "PASS")] * 11
