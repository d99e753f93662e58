"""End-to-end throughput and idle latency of text tasks through every service (separate processes).

    .venv/bin/python -m tests.benchmarks.bench_throughput [--tasks 20000] [--devices 200] [--workers 2]
        [--security auth|tls|anonymous]

Prints: submit rate, end-to-end tasks/s (first submit to last result stored), and the Submit -> result
latency of single tasks on an idle system (p50 / max over 20). `measure()` returns the same numbers (the
report of `python -m tests.benchmarks` compares its rate with Celery's on the same workload).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

import asyncpg

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.cluster import running_cluster
from tests.benchmarks.common import metric_samples, submit_all, wait_final
from tests.support.cluster import Cluster

TEXTS = [
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


@dataclass
class Throughput:
    """One run: `rate` is end to end (first submit to the last result in PostgreSQL)."""

    tasks: int
    devices: int
    workers: int
    rate: float = 0.0
    submit_rate: float = 0.0
    seconds: float = 0.0
    idle_p50_ms: float = 0.0
    idle_max_ms: float = 0.0
    succeeded: int = 0
    #: rows per statement of each group-commit writer, over all workers
    group_commits: dict[str, float] = field(default_factory=dict)


async def measure(
    tasks: int = 20000,
    devices: int = 200,
    workers: int = 2,
    batch: int = 200,
    concurrency: int = 4,
    security: str = "auth",
    idle_tasks: int = 20,
    timeout_s: float = 600,
) -> Throughput:
    out = Throughput(tasks, devices, workers)
    async with running_cluster(
        workers=workers,
        security=security,
        SIEVE_MAX_TOTAL_PENDING=str(tasks + 1000),
        SIEVE_MAX_PER_DEVICE_PENDING=str(tasks),
        SIEVE_CALLER_MAX_PENDING=str(tasks + 1000),
        SIEVE_CALLER_SUBMIT_RATE_PER_S="0",
    ) as cluster:
        s = cluster.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        try:
            async with rpc.channel(s.intake_addr, s) as channel:
                stub = intake_pb2_grpc.IntakeServiceStub(channel)

                # idle latency: one task at a time
                latencies = []
                for i in range(idle_tasks):
                    t0 = time.perf_counter()
                    reply = await stub.Submit(
                        intake_pb2.SubmitRequest(
                            task=intake_pb2.TaskSpec(
                                device_id=f"20:00:00:00:00:{i:02x}", type=types_pb2.TASK_TYPE_TEXT, text=TEXTS[i % 10]
                            )
                        )
                    )
                    # a client polls GetTask: that is the latency it sees
                    while (  # noqa: ASYNC110
                        await stub.GetTask(intake_pb2.GetTaskRequest(task_id=reply.task.task_id))
                    ).task.status != types_pb2.TASK_STATUS_SUCCEEDED:
                        await asyncio.sleep(0.001)
                    latencies.append((time.perf_counter() - t0) * 1000)
                out.idle_p50_ms, out.idle_max_ms = statistics.median(latencies), max(latencies)

                # throughput
                rng = random.Random(1)
                specs = [
                    intake_pb2.TaskSpec(
                        device_id=f"30:00:00:00:{d // 256:02x}:{d % 256:02x}",
                        type=types_pb2.TASK_TYPE_TEXT,
                        text=f"{rng.choice(TEXTS)} {i}",
                    )
                    for i, d in enumerate(rng.randrange(devices) for _ in range(tasks))
                ]
                t0 = time.perf_counter()
                await submit_all(stub, specs, chunk=batch, concurrency=concurrency)
                submitted = time.perf_counter() - t0
                done = await wait_final(pg, tasks + idle_tasks, timeout_s, statuses=("SUCCEEDED",))
                out.seconds = done - t0
                out.rate, out.submit_rate = tasks / out.seconds, tasks / submitted
                out.succeeded = await pg.fetchval("SELECT count(*) FROM tasks WHERE status = 'SUCCEEDED'")
                out.group_commits = {
                    writer: rows / writes for writer, (writes, rows) in sorted(group_commits(cluster).items()) if writes
                }
        finally:
            await pg.close()
    return out


def group_commits(cluster: Cluster) -> dict[str, tuple[float, float]]:
    """(statements, rows) per group-commit writer, summed over the workers' /metrics."""
    sums: dict[str, list[float]] = {}
    for name, address in cluster.metrics.items():
        if not name.startswith("worker"):
            continue
        for sample in metric_samples(address):
            if sample.name in ("sieve_worker_db_writes_total", "sieve_worker_db_rows_total"):
                pair = sums.setdefault(sample.labels["writer"], [0.0, 0.0])
                pair[sample.name.endswith("rows_total")] += sample.value
    return {writer: (writes, rows) for writer, (writes, rows) in sums.items()}


def describe(run: Throughput) -> str:
    return (
        f"idle Submit->result (client-observed, incl. polling): p50 {run.idle_p50_ms:.1f} ms, "
        f"max {run.idle_max_ms:.1f} ms\n"
        f"{run.tasks} tasks over {run.devices} devices, {run.workers} workers: submitted at "
        f"{run.submit_rate:.0f}/s, all stored in {run.seconds:.2f}s -> {run.rate:.0f} tasks/s end to end\n"
        "group commits (rows per statement, all workers): "
        + ", ".join(f"{writer} {rows:.1f}" for writer, rows in run.group_commits.items())
    )


async def main(args: argparse.Namespace) -> None:
    print(describe(await measure(args.tasks, args.devices, args.workers, args.batch, args.concurrency, args.security)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--security",
        choices=("auth", "tls", "anonymous"),
        default="auth",
        help="credentials (default), credentials and TLS, or neither (to measure their cost)",
    )
    asyncio.run(main(parser.parse_args()))
