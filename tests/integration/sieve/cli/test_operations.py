"""`sieve dlq`, `workers`, `stats` and `top` against the real services of one test (registry, scheduler, intake on
loopback, real workers or a scripted Pull stream that fails every task; real Redis and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import sys

import asyncpg
from redis.asyncio import Redis

from sieve.settings import Settings
from sieve.v1 import scheduler_pb2
from tests.integration.conftest import Platform, platform_with
from tests.integration.pull_client import ScriptedWorker
from tests.integration.sieve.cli.conftest import Sieve, addresses, json_of
from tests.security.auth_stack import eventually

DEVICE = "AA-BB-CC-DD-EE-01"


def always_fail(_: scheduler_pb2.Assignment) -> scheduler_pb2.Nack:
    return scheduler_pb2.Nack(reason="transient failure", count_attempt=True)


async def test_dlq_lists_requeues_and_purges_dead_letters(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve
) -> None:
    async with platform_with(settings, redis, pg, max_attempts=1) as p:
        # Given four tasks of two devices that a failing worker dead-letters
        devices = ["AA-BB-CC-DD-EE-01", "AA-BB-CC-DD-EE-02"]
        ids = []
        for n in range(4):
            data = json_of(await sieve(p.settings, "submit", "-d", devices[n % 2], f"text {n}", "-o", "json"))
            ids.append(data["results"][0]["task_id"])
        async with ScriptedWorker(p.settings, policy=always_fail):
            await eventually(lambda: _dead(p, 4), 15, "not dead-lettered")
        # When they are listed (all, then one device's)
        listed = json_of(await sieve(p.settings, "dlq", "ls", "-o", "json"))
        assert sorted(d["task_id"] for d in listed["dead_letters"]) == sorted(ids) and listed["total"] == 4
        assert all(d["error"] == "transient failure" for d in listed["dead_letters"])
        one = json_of(await sieve(p.settings, "dlq", "ls", "-d", "aa:bb:cc:dd:ee:02", "-o", "json"))
        assert sorted(d["task_id"] for d in one["dead_letters"]) == sorted(ids[1::2])
        table = await sieve(p.settings, "dlq", "ls")
        assert table.exit_code == 0 and "4 dead letters (of 4 kept)" in table.stdout and ids[0] in table.stdout
        # an empty filter needs --all (a usage error, exit 2), a bad device the server's refusal (exit 2)
        bare = await sieve(p.settings, "dlq", "requeue")
        assert bare.exit_code == 2 and "--all" in bare.stderr
        bad = await sieve(p.settings, "dlq", "ls", "-d", "nope")
        assert bad.exit_code == 2 and "filter.device_id" in bad.stderr and "Traceback" not in bad.output
        # purge asks first: "no" changes nothing
        declined = await sieve(p.settings, "dlq", "purge", "--task", ids[0], stdin="n\n")
        assert declined.exit_code == 1 and json_of(await sieve(p.settings, "dlq", "ls", "-o", "json"))["total"] == 4
        purged = json_of(await sieve(p.settings, "dlq", "purge", "--task", ids[0], "--yes", "-o", "json"))
        assert purged == {"purged": 1}
        # requeue one device's, then the rest with --all; a real worker then finishes them
        requeued = json_of(await sieve(p.settings, "dlq", "requeue", "-d", devices[1], "-o", "json"))
        assert sorted(requeued["task_ids"]) == sorted(ids[1::2]) and requeued["requeued"] == 2
        rest = await sieve(p.settings, "dlq", "requeue", "--all")
        assert rest.exit_code == 0 and "requeued 1 tasks" in rest.stdout and ids[2] in rest.stdout
        await p.add_worker(worker_id="real-1")
        watched = await sieve(p.settings, "watch", *ids[1:], "-o", "json")
        assert watched.exit_code == 0 and watched.stdout.count("TASK_STATUS_SUCCEEDED") >= 3
        assert json_of(await sieve(p.settings, "dlq", "ls", "-o", "json"))["total"] == 0


async def _dead(p: Platform, count: int) -> bool:
    reply = await p.scheduler_stub.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest())
    return reply.total >= count


async def test_workers_lists_the_live_workers_with_their_load(platform: Platform, sieve: Sieve) -> None:
    await platform.add_worker(worker_id="worker-2")

    async def both() -> bool:
        return len(json_of(await sieve(platform.settings, "workers", "-o", "json"))["workers"]) == 2

    await eventually(both, 10, "worker-2 not registered")
    data = json_of(await sieve(platform.settings, "workers", "-o", "json"))
    assert [w["worker_id"] for w in data["workers"]] == ["worker-1", "worker-2"]
    assert all(w["task_types"] == ["TASK_TYPE_TEXT"] and w["resources"]["cpu_count"] >= 1 for w in data["workers"])
    table = await sieve(platform.settings, "workers")
    assert table.exit_code == 0 and "2 workers" in table.stdout and "worker-2" in table.stdout
    assert "TEXT" in table.stdout and "heartbeat" in table.stdout
    none = json_of(await sieve(platform.settings, "workers", "--type", "ocr_image", "-o", "json"))
    assert none == {"workers": []}


async def test_stats_counts_the_finished_tasks(platform: Platform, sieve: Sieve) -> None:
    json_of(
        await sieve(platform.settings, "submit", "-d", DEVICE, "加 微 信 免费领取", "a", "b", "--wait", "-o", "json")
    )
    data = json_of(await sieve(platform.settings, "stats", "--hours", "2", "--by-device", "-o", "json"))
    assert data["totals"]["succeeded"] == "3" and data["granularity"] == "STATS_GRANULARITY_HOUR"
    assert {b["device_id"] for b in data["buckets"]} == {"AA:BB:CC:DD:EE:01"}
    assert data["top_words"]
    table = await sieve(platform.settings, "stats", "--days", "1", "--type", "text")
    assert table.exit_code == 0, table.output
    assert "totals" in table.stdout and "top words" in table.stdout and "queue now: 0 pending" in table.stdout


async def test_top_once_shows_devices_queues_workers_and_throughput(
    platform_without_workers: Platform, sieve: Sieve
) -> None:
    p = platform_without_workers
    # Given tasks of two devices waiting (no worker), then a worker that finishes another device's
    json_of(await sieve(p.settings, "submit", "-d", DEVICE, "w1", "w2", "w3", "-o", "json"))
    json_of(await sieve(p.settings, "submit", "-d", "AA-BB-CC-DD-EE-02", "w4", "--priority", "high", "-o", "json"))
    frame = json_of(await sieve(p.settings, "top", "--once", "-o", "json"))
    assert [(d["device_id"], d["pending"]) for d in frame["devices"]] == [
        ("AA:BB:CC:DD:EE:01", 3),
        ("AA:BB:CC:DD:EE:02", 1),
    ]
    assert all(d["oldest_wait_s"] > 0 for d in frame["devices"])
    assert frame["pending_by_priority"] == {"HIGH": 1, "NORMAL": 3}
    assert frame["watermark"]["total_pending"] == "4" and frame["queue"]["pending"] == "4"
    assert frame["workers"] == [] and frame["errors"] == {}
    await p.add_worker(worker_id="worker-top")
    await eventually(lambda: _all_done(p), 15, "tasks not done")

    async def registered() -> bool:
        return bool(json_of(await sieve(p.settings, "workers", "-o", "json"))["workers"])

    await eventually(registered, 10, "worker-top not registered")
    frame = json_of(await sieve(p.settings, "top", "--once", "-o", "json"))
    assert [w["worker_id"] for w in frame["workers"]] == ["worker-top"]
    assert frame["finished"] == 4 and frame["throughput_per_s"] > 0
    shares = {d["device_id"]: d["share"] for d in frame["devices"]}
    assert shares == {"AA:BB:CC:DD:EE:01": 0.75, "AA:BB:CC:DD:EE:02": 0.25}
    table = await sieve(p.settings, "top", "--once")
    assert table.exit_code == 0, table.output
    for part in ("sieve top", "throughput", "queues", "busiest devices", "1 workers", "worker-top", "75.0%"):
        assert part in table.stdout, part


async def _all_done(p: Platform) -> bool:
    open_tasks = await p.pg.fetchval("SELECT count(*) FROM tasks WHERE status NOT IN ('SUCCEEDED')")
    return bool(open_tasks == 0)


async def test_top_prints_frame_after_frame_with_the_throughput_between_them(platform: Platform, sieve: Sieve) -> None:
    # Given tasks being submitted while `sieve top` runs
    async def load() -> None:
        for n in range(8):
            await sieve(platform.settings, "submit", "-d", DEVICE, *(f"t{n}-{i}" for i in range(20)), "--no-progress")
            await asyncio.sleep(0.2)

    loading = asyncio.create_task(load())
    top = await sieve(platform.settings, "top", "--interval", "0.5", "--frames", "4", "-o", "json")
    await loading
    assert top.exit_code == 0, top.stderr
    frames = [json.loads(line) for line in top.stdout.splitlines()]
    assert len(frames) == 4
    assert [f["throughput_over"] for f in frames[1:]] == ["now"] * 3
    assert any(f["throughput_per_s"] > 0 for f in frames[1:]) and frames[-1]["finished"] > frames[0]["finished"]
    # a table per frame to a pipe
    tables = await sieve(platform.settings, "top", "--interval", "0.2", "--frames", "2")
    assert tables.exit_code == 0, tables.stderr
    assert tables.stdout.count("sieve top —") == 2 and tables.stdout.count("busiest devices") == 2


async def test_a_listing_piped_into_a_reader_that_is_gone_ends_without_a_word(platform: Platform, sieve: Sieve) -> None:
    for device in (DEVICE, "AA-BB-CC-DD-EE-02"):  # under each device's pending limit (200)
        json_of(await sieve(platform.settings, "submit", "-d", device, *(f"p{n}" for n in range(150)), "-o", "json"))
    argv = " ".join([sys.executable, "-m", "sieve.cli", *addresses(platform.settings), "ls", "-n", "300", "-o", "json"])
    process = await asyncio.create_subprocess_shell(
        f"set -o pipefail; {argv} | true",  # the reader is gone before the first write
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=sieve.environment(),
        executable="/bin/bash",
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert out == b""
    assert err == b"" and process.returncode == 1, (err, process.returncode)
