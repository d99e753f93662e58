"""End to end: the four services as separate processes; 2 000 texts over 100 devices all succeed with
the right hits, GetTask returns them, and SIGTERM stops every service cleanly with nothing in flight."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.queue_store import QueueStore
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import Cluster
from worker_svc.text import Matcher, load_lexicon_file

pytestmark = pytest.mark.e2e

SENTENCES = [
    "今天天气很好",
    "欢迎加 微 信领取优惠",
    "这里有 赌.博 网站",
    "ｃａｓｉｎｏ night",
    "hello world",
    "免费领取 free money",
    "正常的产品评论",
    "cocaine is bad",
    "六合彩开奖",
    "nothing to see here",
]


async def test_two_thousand_texts_over_a_hundred_devices_all_succeed_with_the_right_hits(
    cluster: Cluster, pg: asyncpg.Pool, redis: Redis
) -> None:
    # Given 2 000 texts over 100 devices
    rng = random.Random(7)
    specs = [
        intake_pb2.TaskSpec(
            device_id=f"10:00:00:00:{d // 256:02x}:{d % 256:02x}",
            type=types_pb2.TASK_TYPE_TEXT,
            text=f"{rng.choice(SENTENCES)} #{i}",
        )
        for i, d in enumerate(rng.randrange(100) for _ in range(2000))
    ]
    started = time.perf_counter()
    async with rpc.channel(cluster.settings.intake_addr, cluster.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        # When they are submitted in batches of 100, concurrently
        replies = await asyncio.gather(
            *(
                stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[i : i + 100]))
                for i in range(0, len(specs), 100)
            )
        )
        ids = [item.task.task_id for r in replies for item in r.items]
        assert len(ids) == 2000 and all(item.code == 0 for r in replies for item in r.items)
        # Then every one succeeds
        deadline = time.monotonic() + 120
        while await pg.fetchval("SELECT count(*) FROM tasks WHERE status = 'SUCCEEDED'") < 2000:
            assert time.monotonic() < deadline, await pg.fetch("SELECT status, count(*) FROM tasks GROUP BY 1")
            await asyncio.sleep(0.1)
        elapsed = time.perf_counter() - started
        print(f"\n2000 tasks end to end in {elapsed:.2f}s: {2000 / elapsed:.0f} tasks/s")
        # with exactly the hits the lexicon gives
        matcher = Matcher(load_lexicon_file())
        rows = await pg.fetch("SELECT t.payload_text, r.hits FROM tasks t JOIN results r ON r.task_id = t.id")
        assert len(rows) == 2000
        for row in rows:
            expected = sorted((h.word, h.start, h.end) for h in matcher.match(row["payload_text"]).hits)
            assert sorted((h["word"], h["start"], h["end"]) for h in row["hits"]) == expected
        # and GetTask returns them
        for task_id in rng.sample(ids, 50):
            task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
            assert task.status == types_pb2.TASK_STATUS_SUCCEEDED
            assert task.result.text

    # And the workers ran below the platform's own processes (SIEVE_WORKER_NICE, default 10), every thread of them
    nice = {name: _nice_of_threads(p.pid) for name, p in cluster.procs.items()}
    own = os.getpriority(os.PRIO_PROCESS, 0)  # what every service inherits from this test
    workers = {n: v for n, v in nice.items() if n.startswith("worker")}
    assert workers == {"worker-1": {max(own, 10)}, "worker-2": {max(own, 10)}}, nice
    assert all(v == {own} for n, v in nice.items() if n not in workers), nice

    # When every service gets SIGTERM
    codes = cluster.terminate_all()
    # Then each exits 0, with nothing queued or leased
    assert codes == dict.fromkeys(codes, 0), {n: cluster.log_of(n) for n, c in codes.items() if c}
    queues = QueueStore(redis, cluster.settings)
    assert await queues.pending() == 0
    assert await redis.zcard(queues.keys.leases) == 0
    assert await pg.fetchval("SELECT count(*) FROM results") == 2000


def _nice_of_threads(pid: int) -> set[int]:
    """The nice values of every thread of a process (field 19 of /proc/<pid>/task/<tid>/stat)."""
    values = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            values.add(int(stat.rsplit(")", 1)[1].split()[16]))
    return values
