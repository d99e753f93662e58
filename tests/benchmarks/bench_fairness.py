"""Fairness benchmark: the real registry, scheduler and intake processes, and a worker whose every task
takes a fixed time (2 ms, 32 at a time; BENCH_PARALLEL changes it), recording when each task starts.

    .venv/bin/python -m tests.benchmarks.bench_fairness [--only noisy,equal,weights,scale]

- noisy:   one device queues 20 000 tasks, then 200 other devices submit 5 each: the small devices'
           submit->start latency (p50 / p99 / max) and the noisy device's throughput meanwhile.
- equal:   50 backlogged devices of weight 1: Jain's fairness index of their served counts per 1 s window.
- weights: three backlogged devices of weights 3:2:1: their shares of the first 3 000 dispatched tasks.
- scale:   claim-and-dispatch rate (the scheduler's Redis path) with 10 active devices vs 100 000.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from redis.asyncio import Redis

from sieve import rpc
from sieve.entry import Entry
from sieve.queue_store import QueueStore, now_ms
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, scheduler_pb2, types_pb2
from tests.benchmarks.cluster import REDIS_URL, cleanup, running_cluster
from worker_svc.pressure import Pressure
from worker_svc.puller import Puller
from worker_svc.resources import ResourceSampler

WORK_S = 0.002
PARALLEL = int(os.environ.get("BENCH_PARALLEL", "32"))


@dataclass
class TimedWorker:
    """Runs every task for WORK_S, PARALLEL at a time; records (device, enqueued ms, start ms)."""

    settings: Settings
    starts: list[tuple[str, float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(PARALLEL)
        self.puller = Puller(self.settings, "bench-worker", [types_pb2.TASK_TYPE_TEXT], False, 4 * PARALLEL,
                             self.run_batch,
                             Pressure(ResourceSampler(self.settings), self.settings))
        self.stop = asyncio.Event()

    async def run_batch(self, batch: list[scheduler_pb2.Assignment]
                        ) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
        for a in batch:
            async with self._slots:
                self.starts.append((a.device_id, a.enqueued_at.ToMilliseconds(), time.time() * 1000))
                await asyncio.sleep(WORK_S)
        return [scheduler_pb2.Ack(task_id=a.task_id, lease_token=a.lease_token) for a in batch], []

    @contextlib.asynccontextmanager
    async def running(self):
        task = asyncio.create_task(self.puller.run(self.stop))
        yield self
        self.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)


def mac(prefix: int, i: int) -> str:
    return f"{prefix:02X}:00:00:{i >> 16 & 255:02X}:{i >> 8 & 255:02X}:{i & 255:02X}"


async def submit_all(stub: intake_pb2_grpc.IntakeServiceStub, specs: list[intake_pb2.TaskSpec],
                     chunk: int = 500) -> None:
    for i in range(0, len(specs), chunk):
        reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[i : i + chunk]))
        assert all(item.code == 0 for item in reply.items), reply.items[0].message


def text(device: str, i: int) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=f"task {i}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def noisy_neighbour() -> None:
    limits = {"SIEVE_MAX_PER_DEVICE_PENDING": "30000", "SIEVE_MAX_TOTAL_PENDING": "60000"}
    async with running_cluster(workers=0, **limits) as cluster:
        s = cluster.settings
        noisy = mac(0xAA, 1)
        worker = TimedWorker(s)
        async with rpc.channel(s.intake_addr, s) as channel, worker.running():
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            await submit_all(stub, [text(noisy, i) for i in range(20000)], chunk=1000)
            queued_at = time.time() * 1000
            small = [text(mac(0xBB, d), i) for d in range(200) for i in range(5)]
            await submit_all(stub, small, chunk=1000)
            while sum(1 for d, _, _ in worker.starts if d != noisy) < len(small):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            done_at = time.time() * 1000
        latencies = [(start - enq) / 1000 for d, enq, start in worker.starts if d != noisy]
        noisy_starts = [start for d, _, start in worker.starts if d == noisy and queued_at <= start <= done_at]
        window_s = (done_at - queued_at) / 1000
        print(f"noisy neighbour: 200 small devices x 5 tasks behind a 20 000-task backlog of one device\n"
              f"  small-device submit->start latency: p50 {statistics.median(latencies):.3f} s, "
              f"p99 {pct(latencies, 0.99):.3f} s, max {max(latencies):.3f} s (target p99 <= 1 s)\n"
              f"  noisy device meanwhile: {len(noisy_starts)} tasks in {window_s:.2f} s "
              f"({len(noisy_starts) / window_s:.0f} tasks/s); its backlog still draining")


def jain(counts: list[int]) -> float:
    total = sum(counts)
    return total * total / (len(counts) * sum(c * c for c in counts)) if total else 1.0


async def equal_share() -> None:
    limits = {"SIEVE_MAX_TOTAL_PENDING": "60000", "SIEVE_MAX_PER_DEVICE_PENDING": "1000"}
    async with running_cluster(workers=0, **limits) as cluster:
        s = cluster.settings
        devices = [mac(0xCC, d) for d in range(50)]
        worker = TimedWorker(s)
        async with rpc.channel(s.intake_addr, s) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            await submit_all(stub, [text(d, i) for i in range(600) for d in devices], chunk=1000)
            async with worker.running():
                await asyncio.sleep(4.5)
        first = min(start for _, _, start in worker.starts)
        windows: dict[int, Counter[str]] = defaultdict(Counter)
        for device, _, start in worker.starts:
            windows[int((start - first) // 1000)][device] += 1
        full = [w for w in sorted(windows) if w < max(windows)]  # drop the last, partial window
        indexes = [jain([windows[w][d] for d in devices]) for w in full]
        served = sum(sum(windows[w].values()) for w in full)
        spread = [(min(windows[w][d] for d in devices), max(windows[w][d] for d in devices)) for w in full]
        print(f"equal share: 50 backlogged devices, weight 1, {served} tasks in {len(full)} full 1 s windows\n"
              f"  Jain's index per window: min {min(indexes):.4f}, mean {statistics.mean(indexes):.4f} "
              f"(target >= 0.99); tasks per device per window (min, max): {spread}")


async def weights() -> None:
    a, b, c = mac(0xDD, 1), mac(0xDD, 2), mac(0xDD, 3)
    async with running_cluster(workers=0, SIEVE_DEVICE_WEIGHTS=f"{a}=3,{b}=2,{c}=1",
                               SIEVE_MAX_PER_DEVICE_PENDING="5000", SIEVE_MAX_TOTAL_PENDING="60000") as cluster:
        s = cluster.settings
        worker = TimedWorker(s)
        async with rpc.channel(s.intake_addr, s) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            await submit_all(stub, [text(d, i) for i in range(3000) for d in (a, b, c)], chunk=1000)
            async with worker.running():
                while len(worker.starts) < 3000:  # noqa: ASYNC110 - the worker records starts
                    await asyncio.sleep(0.05)
        first = Counter(device for device, _, _ in sorted(worker.starts, key=lambda x: x[2])[:3000])
        shares = [first[d] / 3000 for d in (a, b, c)]
        print(f"weights 3:2:1, first 3 000 dispatched tasks: shares {shares[0]:.3f} / {shares[1]:.3f} / "
              f"{shares[2]:.3f} (target 0.500 / 0.333 / 0.167 within +-5 %)")


async def claim_rate(devices: int, rounds: int) -> float:
    settings = Settings.from_env({}, redis_url=REDIS_URL, redis_prefix=f"bench-scale-{uuid.uuid4().hex[:6]}",
                                 max_total_pending=10**7, max_per_device_pending=10**6)
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    queues = QueueStore(redis, settings)
    await queues.mark_rebuilt("bench")
    try:
        now = int(now_ms())
        per_device = max(2, (rounds * 10) // devices + 1)
        for start in range(0, devices, 1000):
            groups = {mac(0xEE, d): [Entry(f"{d}-{i}", 1, 3, now, now + 10**8) for i in range(per_device)]
                      for d in range(start, min(devices, start + 1000))}
            await queues.enqueue_many(groups)
        rank = await queues.rank()
        t0 = time.perf_counter()
        for _ in range(rounds):
            assert rank.mac is not None
            popped, nxt = await queues.pop_and_rank(rank.mac, "bench", 10, [1])
            await queues.ack([(e.task_id, e.attempt) for e in popped.taken])
            rank = nxt if nxt.mac else await queues.rank()
        return rounds / (time.perf_counter() - t0)
    finally:
        await cleanup(settings)
        await redis.aclose()


async def scale() -> None:
    await claim_rate(10, 500)  # warm up: connections, script cache
    small = await claim_rate(10, 3000)
    large = await claim_rate(100_000, 3000)
    print(f"scale: claim-and-dispatch rounds/s with 10 active devices {small:.0f}, with 100 000 {large:.0f}: "
          f"ratio {large / small:.2f} (target >= 0.8)")


async def main(only: set[str]) -> None:
    for name, bench in (("noisy", noisy_neighbour), ("equal", equal_share), ("weights", weights),
                        ("scale", scale)):
        if name in only:
            await bench()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="noisy,equal,weights,scale")
    asyncio.run(main(set(parser.parse_args().only.split(","))))
