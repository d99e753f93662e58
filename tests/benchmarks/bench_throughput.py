"""End-to-end throughput and idle latency of text tasks through every service (separate processes).

    .venv/bin/python -m tests.benchmarks.bench_throughput [--tasks 20000] [--devices 200] [--workers 2]
        [--security auth|tls|anonymous]

Prints: submit rate, end-to-end tasks/s (first submit to last result stored), and the Submit -> result
latency of single tasks on an idle system (p50 / max over 20).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import urllib.request

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.cluster import running_cluster
from tests.e2e.conftest import Cluster

TEXTS = ["今天天气很好", "欢迎加 微 信领取优惠", "这里有 赌.博 网站", "ｃａｓｉｎｏ night", "hello world",
         "免费领取 free money", "正常的产品评论", "cocaine is bad", "六合彩开奖", "nothing to see here"]


async def main(args: argparse.Namespace) -> None:
    async with running_cluster(workers=args.workers, security=args.security,
                               SIEVE_MAX_TOTAL_PENDING=str(args.tasks + 1000),
                               SIEVE_MAX_PER_DEVICE_PENDING=str(args.tasks)) as cluster:
        s = cluster.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        async with rpc.channel(s.intake_addr, s) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)

            # idle latency: one task at a time
            latencies = []
            for i in range(20):
                t0 = time.perf_counter()
                reply = await stub.Submit(intake_pb2.SubmitRequest(task=intake_pb2.TaskSpec(
                    device_id=f"20:00:00:00:00:{i:02x}", type=types_pb2.TASK_TYPE_TEXT, text=TEXTS[i % 10])))
                # a client polls GetTask: that is the latency it sees
                while (await stub.GetTask(intake_pb2.GetTaskRequest(  # noqa: ASYNC110
                        task_id=reply.task.task_id))).task.status != types_pb2.TASK_STATUS_SUCCEEDED:
                    await asyncio.sleep(0.001)
                latencies.append((time.perf_counter() - t0) * 1000)
            print(f"idle Submit->result (client-observed, incl. polling): p50 {statistics.median(latencies):.1f} ms,"
                  f" max {max(latencies):.1f} ms")

            # throughput
            rng = random.Random(1)
            specs = [intake_pb2.TaskSpec(device_id=f"30:00:00:00:{d // 256:02x}:{d % 256:02x}",
                                         type=types_pb2.TASK_TYPE_TEXT, text=f"{rng.choice(TEXTS)} {i}")
                     for i, d in enumerate(rng.randrange(args.devices) for _ in range(args.tasks))]
            batches = [specs[i : i + args.batch] for i in range(0, len(specs), args.batch)]
            sem = asyncio.Semaphore(args.concurrency)

            async def send(batch: list[intake_pb2.TaskSpec]) -> None:
                async with sem:
                    reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=batch))
                    assert all(item.code == 0 for item in reply.items)

            t0 = time.perf_counter()
            await asyncio.gather(*(send(b) for b in batches))
            submitted = time.perf_counter() - t0
            target = args.tasks + 20
            while await pg.fetchval(  # noqa: ASYNC110 - results are counted in PostgreSQL
                    "SELECT count(*) FROM tasks WHERE status = 'SUCCEEDED'") < target:
                await asyncio.sleep(0.05)
            total = time.perf_counter() - t0
            print(f"{args.tasks} tasks over {args.devices} devices, {args.workers} workers: "
                  f"submitted in {submitted:.2f}s ({args.tasks / submitted:.0f}/s), "
                  f"all stored in {total:.2f}s -> {args.tasks / total:.0f} tasks/s end to end")
            print("group commits (rows per statement, all workers): " + ", ".join(
                f"{writer} {rows / writes:.1f}" for writer, (writes, rows) in sorted(group_commits(cluster).items())
                if writes))
        await pg.close()


def group_commits(cluster: Cluster) -> dict[str, tuple[float, float]]:
    """(statements, rows) per group-commit writer, summed over the workers' /metrics."""
    sums: dict[str, list[float]] = {}
    for name, address in cluster.metrics.items():
        if not name.startswith("worker"):
            continue
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in ("sieve_worker_db_writes_total", "sieve_worker_db_rows_total"):
                    pair = sums.setdefault(sample.labels["writer"], [0.0, 0.0])
                    pair[sample.name.endswith("rows_total")] += sample.value
    return {writer: (writes, rows) for writer, (writes, rows) in sums.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--security", choices=("auth", "tls", "anonymous"), default="auth",
                        help="credentials (default), credentials and TLS, or neither (to measure their cost)")
    asyncio.run(main(parser.parse_args()))
