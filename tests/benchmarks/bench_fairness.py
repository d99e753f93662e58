"""Fairness benchmarks: the real registry, scheduler and intake processes, and either real worker processes or
an in-process timed worker (the real Pull protocol through `worker_svc.puller.Puller`, but every task takes a
fixed 2 ms, 32 at a time; BENCH_PARALLEL changes it) that records which device each task came from and when it
started — the order the scheduler hands work out in, without detection's own cost in the way.

    .venv/bin/python -m tests.benchmarks.bench_fairness [--only noisy,equal,weights,callers,claims] [--smoke]

- noisy:   real workers (2 processes). One device queues 20 000 tasks, then 200 other devices submit 5 each
           (one SubmitBatch of 1 000): how long each small device waits behind the backlog for its first hand-out
           once its tasks are queued (p50 / p99 / max over the devices: its first task's record stamp plus the
           intake's steps up to the end of the enqueue, to its first hand-out; target p99 <= 0.1 s); as context,
           the same from the record stamp (the intake's own work on the 1 000-task batch included, with its
           steps), per small task (the last of 1 000 tasks queued at once waits for 1 000 credits to come back,
           about 1 000 / the workers' rate, in any order) and the noisy device's throughput meanwhile.
- equal:   50 backlogged devices of weight 1 (timed worker): Jain's fairness index of their served counts per
           1 s window while every one of them is still backlogged. Target >= 0.99 in every window.
- weights: three backlogged devices of weights 3:2:1 (timed worker): their shares of the first 3 000 tasks
           handed out. Target 0.500 / 0.333 / 0.167, each within +-5 % of its own value.
- callers: two callers (two client credentials), one submitting over 1 000 devices, the other over one, both
           backlogged (timed worker): each caller's share of the first tasks handed out. Target 50 % +- 5 points.
- claims:  the queue store's claim-and-dispatch rate (Redis only: no dispatcher, gRPC or worker) with 10 active
           devices vs 100 000. Context for `bench_scale`, which measures the same question end to end.

Each function returns its measurements (`*Result`); `rows()` turns them into report rows with their targets. Every
benchmark drains what it queued, so several may share one cluster (`cluster=`, as the CI smoke test does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
from redis.asyncio import Redis

from sieve import rpc
from sieve.launch import free_port
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.settings import Settings
from sieve.v1 import intake_pb2_grpc
from tests.benchmarks.cluster import cleanup, running_cluster
from tests.benchmarks.common import (
    TaskTiming,
    jain,
    mac,
    pct,
    step_means,
    submit_all,
    submit_steps,
    task_timings,
    text,
    wait_final,
)
from tests.benchmarks.report import Row, num
from tests.benchmarks.timed_worker import Start, TimedWorker
from tests.support.cluster import Cluster
from tests.support.stores import REDIS_URL

NOISY_P99_S = 0.1
JAIN_MIN = 0.99
WEIGHTS = (3, 2, 1)
WEIGHT_DEVICES = tuple(mac(0xDD, i + 1) for i in range(len(WEIGHTS)))
WEIGHT_TOLERANCE = 0.05  # of each share's own value
CALLER_SHARE, CALLER_TOLERANCE = 0.5, 0.05
#: the in-process workers and the two callers of `callers` (credentials made before the services start)
CREDENTIALS = {
    "bench-equal": "worker",
    "bench-weights": "worker",
    "bench-callers": "worker",
    "caller-a": "client",
    "caller-b": "client",
}


def fairness_env(tasks: int = 60000) -> dict[str, str]:
    """The settings every fairness benchmark's cluster runs with: limits out of the way of `tasks` queued at
    once (global, per device, per caller, no submit rate limit) and the devices of `weights` weighted."""
    return {
        "SIEVE_MAX_TOTAL_PENDING": str(tasks),
        "SIEVE_MAX_PER_DEVICE_PENDING": str(tasks),
        "SIEVE_CALLER_MAX_PENDING": str(tasks),
        "SIEVE_CALLER_SUBMIT_RATE_PER_S": "0",
        "SIEVE_DEVICE_WEIGHTS": ",".join(f"{d}={w}" for d, w in zip(WEIGHT_DEVICES, WEIGHTS, strict=True)),
        # the intake's metrics: the noisy benchmark reads the time of each step of the small devices' submit
        "SIEVE_INTAKE_METRICS_ADDR": f"127.0.0.1:{free_port()}",
    }


@contextlib.asynccontextmanager
async def cluster_for(cluster: Cluster | None, workers: int, tasks: int) -> AsyncIterator[Cluster]:
    """`cluster` when one is given, else a fresh one with the fairness settings."""
    if cluster is not None:
        yield cluster
        return
    async with running_cluster(workers=workers, credentials=CREDENTIALS, **fairness_env(tasks)) as fresh:
        yield fresh


def first_starts(worker: TimedWorker) -> list[Start]:
    """Each task's first start, in the order they started (a task handed out again counts once)."""
    seen: dict[str, Start] = {}
    for s in sorted(worker.starts, key=lambda s: s.started_ms):
        seen.setdefault(s.task_id, s)
    return list(seen.values())


# --- noisy neighbour (real workers) ----------------------------------------------------------------------------
@dataclass
class NoisyResult:
    noisy_tasks: int
    small_devices: int
    small_per_device: int
    small_done: int = 0
    noisy_done: int = 0
    lost: int = 0
    #: each small device's wait for its first hand-out once its tasks were queued (claimable), the target: its
    #: first task's record stamp plus the intake's steps up to the end of the enqueue (read from the intake's
    #: metrics; the gaps between steps are not added, so the wait is if anything overstated), to its first hand-out
    queued_p50_s: float = 0.0
    queued_p99_s: float = 0.0
    queued_max_s: float = 0.0
    #: each small device's wait for its first hand-out from its first task's record stamp, the intake's own work
    #: on the 1 000-task SubmitBatch included (context: on a saturated machine most of it is that SubmitBatch)
    p50_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0
    #: each small task's wait for its hand-out (context: the last of 1 000 tasks queued at once waits for about
    #: 1 000 credits to come back, 1 000 / the workers' rate, whatever the order)
    task_p50_s: float = 0.0
    task_p99_s: float = 0.0
    noisy_rate: float = 0.0
    window_s: float = 0.0
    #: the small devices' SubmitBatch round trip (their tasks' records are stamped before it is sent back), and
    #: each small device's first hand-out after that reply (p99): where the wait goes, submit or schedule
    submit_s: float = 0.0
    after_reply_p99_s: float = 0.0
    #: the intake's time in each step of that SubmitBatch (sieve_submit_step_seconds), where it reads them
    submit_steps_s: dict[str, float] = field(default_factory=dict)


async def noisy_neighbour(
    noisy_tasks: int = 20000,
    small_devices: int = 200,
    small_per_device: int = 5,
    cluster: Cluster | None = None,
    timeout_s: float = 600,
) -> NoisyResult:
    out = NoisyResult(noisy_tasks, small_devices, small_per_device)
    noisy = mac(0xAA, 1)
    small = [text(mac(0xBB, d), i) for d in range(small_devices) for i in range(small_per_device)]
    async with cluster_for(cluster, 2, noisy_tasks + len(small) + 1000) as c:
        s = c.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        try:
            before = await pg.fetchval("SELECT count(*) FROM tasks")
            async with rpc.channel(s.intake_addr, s) as channel:
                stub = intake_pb2_grpc.IntakeServiceStub(channel)
                await submit_all(stub, [text(noisy, i) for i in range(noisy_tasks)])
                metrics_addr = c.env.get("SIEVE_INTAKE_METRICS_ADDR")
                steps = await submit_steps(metrics_addr) if metrics_addr else {}
                sent = time.time()
                await submit_all(stub, small)
                replied = time.time()
                out.submit_s = replied - sent
                if metrics_addr:
                    out.submit_steps_s = step_means(steps, await submit_steps(metrics_addr))
                await wait_final(pg, before + noisy_tasks + len(small), timeout_s)
            timings = await task_timings(pg, "AA:00:00:") + await task_timings(pg, "BB:00:00:")
        finally:
            await pg.close()
    small_t = [t for t in timings if t.device != noisy]
    noisy_t = [t for t in timings if t.device == noisy]
    out.small_done = sum(1 for t in small_t if t.status == "SUCCEEDED")
    out.noisy_done = sum(1 for t in noisy_t if t.status == "SUCCEEDED")
    out.lost = noisy_tasks + len(small) - len(timings)
    latencies = [max(0.0, t.started_s - t.submitted_s) for t in small_t]
    by_device: dict[str, list[TaskTiming]] = {}
    for t in small_t:
        by_device.setdefault(t.device, []).append(t)
    # each small device's first task's record stamp and its first hand-out
    firsts = [(min(t.submitted_s for t in mine), min(t.started_s for t in mine)) for mine in by_device.values()]
    device_waits = [max(0.0, started - created) for created, started in firsts]
    if latencies:
        out.p50_s, out.p99_s = statistics.median(device_waits), pct(device_waits, 0.99)
        out.max_s = max(device_waits)
        # the intake's steps end with the enqueue: the tasks are claimable from then (without the metrics, from
        # the SubmitBatch reply, which comes after the enqueue)
        intake_s = sum(out.submit_steps_s.values())
        queued = [max(0.0, started - (created + intake_s if intake_s else replied)) for created, started in firsts]
        out.queued_p50_s, out.queued_p99_s, out.queued_max_s = statistics.median(queued), pct(queued, 0.99), max(queued)
        out.after_reply_p99_s = pct([max(0.0, started - replied) for _, started in firsts], 0.99)
        out.task_p50_s, out.task_p99_s = statistics.median(latencies), pct(latencies, 0.99)
        first, last = min(t.submitted_s for t in small_t), max(t.started_s for t in small_t)
        out.window_s = max(last - first, 1e-3)
        out.noisy_rate = sum(1 for t in noisy_t if first <= t.started_s <= last) / out.window_s
    return out


def noisy_rows(r: NoisyResult) -> list[Row]:
    total_small = r.small_devices * r.small_per_device
    values = {
        "queued_p50_s": round(r.queued_p50_s, 4),
        "queued_p99_s": round(r.queued_p99_s, 4),
        "queued_max_s": round(r.queued_max_s, 4),
        "p50_s": round(r.p50_s, 4),
        "p99_s": round(r.p99_s, 4),
        "max_s": round(r.max_s, 4),
        "task_p50_s": round(r.task_p50_s, 4),
        "task_p99_s": round(r.task_p99_s, 4),
        "noisy_tasks_per_s_meanwhile": round(r.noisy_rate),
        "small_done": r.small_done,
        "small_tasks": total_small,
        "noisy_done": r.noisy_done,
        "noisy_tasks": r.noisy_tasks,
        "lost": r.lost,
        "small_submit_batch_s": round(r.submit_s, 4),
        "first_hand_out_after_reply_p99_s": round(r.after_reply_p99_s, 4),
        "small_submit_steps_s": {step: round(seconds, 4) for step, seconds in r.submit_steps_s.items()},
    }
    return [
        Row(
            "noisy",
            f"small devices' wait behind {num(r.noisy_tasks)} queued tasks of one device: queued -> first hand-out",
            f"p50 {r.queued_p50_s:.3f} s, p99 {r.queued_p99_s:.3f} s, max {r.queued_max_s:.3f} s; after the "
            f"SubmitBatch reply p99 {r.after_reply_p99_s:.3f} s; noisy device meanwhile {num(r.noisy_rate)} tasks/s",
            f"p99 <= {NOISY_P99_S} s",
            r.queued_p99_s <= NOISY_P99_S and r.small_done > 0,
            values,
        ),
        Row(
            "noisy",
            "the same from the record stamp, the intake's SubmitBatch of every small task (1 000 at once) included",
            f"p50 {r.p50_s:.3f} s, p99 {r.p99_s:.3f} s, max {r.max_s:.3f} s; every small task p50 "
            f"{r.task_p50_s:.3f} s, p99 {r.task_p99_s:.3f} s; the SubmitBatch took {r.submit_s:.3f} s ("
            + ", ".join(f"{step} {seconds * 1000:.0f} ms" for step, seconds in r.submit_steps_s.items())
            + ")",
            "context",
            None,
            values,
        ),
        Row(
            "noisy",
            "every task done, none lost",
            f"small {r.small_done} / {total_small}, noisy {r.noisy_done} / {r.noisy_tasks}, lost {r.lost}",
            "all",
            r.small_done == total_small and r.noisy_done == r.noisy_tasks and r.lost == 0,
            values,
        ),
    ]


# --- equal share (timed worker) --------------------------------------------------------------------------------
@dataclass
class EqualResult:
    devices: int
    per_device: int
    #: windows of this many seconds, or (when window_tasks is set) of this many consecutive hand-outs
    window_s: float
    window_tasks: int = 0
    started: int = 0
    windows: int = 0
    served_in_windows: int = 0
    jain_min: float = 0.0
    jain_mean: float = 0.0
    #: (fewest, most) tasks of one device per window
    spread: list[tuple[int, int]] = field(default_factory=list)

    @property
    def window(self) -> str:
        return f"{num(self.window_tasks)} consecutive tasks" if self.window_tasks else f"{self.window_s:g} s"


async def equal_share(
    devices: int = 50,
    per_device: int = 600,
    window_s: float = 1.0,
    window_tasks: int = 0,
    cluster: Cluster | None = None,
    timeout_s: float = 600,
) -> EqualResult:
    """Every device queues `per_device` tasks, then the timed worker runs them all; Jain's index of the devices'
    counts in each window while all of them are still backlogged (until the first has had its last task).
    Windows are `window_s` seconds, or `window_tasks` consecutive hand-outs (independent of timing: the smoke
    test's choice)."""
    out = EqualResult(devices, per_device, window_s, window_tasks)
    macs = [mac(0xCC, d) for d in range(devices)]
    async with cluster_for(cluster, 0, devices * per_device + 1000) as c:
        worker = TimedWorker.of(c, "bench-equal")
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            await submit_all(stub, [text(d, i) for i in range(per_device) for d in macs])
            async with worker.running():
                await worker.wait_started(devices * per_device, timeout_s)
    starts = first_starts(worker)
    out.started = len(starts)
    first = starts[0].started_ms
    # every device is backlogged until the first of them has had its last task
    until = min(max(i for i, s in enumerate(starts) if s.device == m) for m in macs)
    windows: dict[int, Counter[str]] = defaultdict(Counter)
    for i, s in enumerate(starts[:until]):
        key = i // window_tasks if window_tasks else int((s.started_ms - first) // (window_s * 1000))
        windows[key][s.device] += 1
    if window_tasks:
        full = [w for w in sorted(windows) if (w + 1) * window_tasks <= until]
    else:
        full = [w for w in sorted(windows) if (w + 1) * window_s * 1000 <= starts[until].started_ms - first]
    indexes = [jain([windows[w][d] for d in macs]) for w in full]
    out.windows = len(full)
    out.served_in_windows = sum(sum(windows[w].values()) for w in full)
    if indexes:
        out.jain_min, out.jain_mean = min(indexes), statistics.mean(indexes)
    out.spread = [(min(windows[w][d] for d in macs), max(windows[w][d] for d in macs)) for w in full]
    return out


def equal_rows(r: EqualResult) -> list[Row]:
    values = {
        "jain_min": round(r.jain_min, 4),
        "jain_mean": round(r.jain_mean, 4),
        "windows": r.windows,
        "window": r.window,
        "served_in_windows": r.served_in_windows,
        "started": r.started,
        "tasks": r.devices * r.per_device,
        "spread": str(r.spread),
    }
    return [
        Row(
            "equal",
            f"Jain's index per window of {r.window}, {r.devices} backlogged devices of weight 1",
            f"min {r.jain_min:.4f}, mean {r.jain_mean:.4f} over {r.windows} windows ({num(r.served_in_windows)} "
            f"tasks); {r.started} / {r.devices * r.per_device} done",
            f">= {JAIN_MIN} in every window",
            r.windows > 0 and r.jain_min >= JAIN_MIN,
            values,
        )
    ]


# --- weights (timed worker) ------------------------------------------------------------------------------------
@dataclass
class WeightsResult:
    per_device: int
    counted: int
    shares: list[float] = field(default_factory=list)
    started: int = 0


async def weights(
    per_device: int = 3000, counted: int = 3000, cluster: Cluster | None = None, timeout_s: float = 600
) -> WeightsResult:
    """Three devices of weights 3:2:1 with `per_device` tasks each; shares of the first `counted` hand-outs
    (at most 2 x `per_device`: the first device, with half of them, is still backlogged until then)."""
    out = WeightsResult(per_device, min(counted, per_device * sum(WEIGHTS) // max(WEIGHTS)))
    async with cluster_for(cluster, 0, 3 * per_device + 1000) as c:
        worker = TimedWorker.of(c, "bench-weights")
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            await submit_all(stub, [text(d, i) for i in range(per_device) for d in WEIGHT_DEVICES])
            async with worker.running():
                await worker.wait_started(3 * per_device, timeout_s)
    starts = first_starts(worker)
    out.started = len(starts)
    first = Counter(s.device for s in starts[: out.counted])
    out.shares = [first[d] / out.counted for d in WEIGHT_DEVICES]
    return out


def weight_targets() -> list[float]:
    return [w / sum(WEIGHTS) for w in WEIGHTS]


def weights_rows(r: WeightsResult) -> list[Row]:
    targets = weight_targets()
    ok = bool(r.shares) and all(abs(s - t) <= WEIGHT_TOLERANCE * t for s, t in zip(r.shares, targets, strict=True))
    return [
        Row(
            "weights",
            f"shares of the first {num(r.counted)} tasks, weights 3 : 2 : 1",
            " / ".join(f"{s:.3f}" for s in r.shares) + f"; {r.started} / {3 * r.per_device} started",
            " / ".join(f"{t:.3f}" for t in targets) + f" each +-{WEIGHT_TOLERANCE:.0%} of itself",
            ok,
            {"shares": r.shares, "targets": targets, "started": r.started, "tasks": 3 * r.per_device},
        )
    ]


# --- callers (timed worker, two client credentials) ------------------------------------------------------------
@dataclass
class CallersResult:
    many_devices: int
    per_device: int
    one_device_tasks: int
    counted: int
    share_many: float = 0.0
    share_one: float = 0.0
    started: int = 0


async def callers(
    many_devices: int = 1000,
    per_device: int = 10,
    counted: int = 8000,
    cluster: Cluster | None = None,
    timeout_s: float = 600,
) -> CallersResult:
    """Caller A submits `per_device` tasks on each of `many_devices` devices, caller B as many tasks on one
    device; the shares of the first `counted` hand-outs (fewer than either caller queued: both stay backlogged
    whatever the order)."""
    b_tasks = many_devices * per_device
    out = CallersResult(many_devices, per_device, b_tasks, min(counted, b_tasks))
    a_macs = [mac(0xC1, d) for d in range(many_devices)]
    b_mac = mac(0xC2, 0)
    async with cluster_for(cluster, 0, 2 * b_tasks + 1000) as c:
        worker = TimedWorker.of(c, "bench-callers")
        a_settings, b_settings = c.as_caller("caller-a"), c.as_caller("caller-b")
        async with (
            rpc.channel(c.settings.intake_addr, a_settings) as a_chan,
            rpc.channel(c.settings.intake_addr, b_settings) as b_chan,
        ):
            a_specs = [text(d, i) for i in range(per_device) for d in a_macs]
            b_specs = [text(b_mac, i) for i in range(b_tasks)]
            # interleaved, so that neither caller's whole backlog is queued before the other's first task
            for i in range(0, b_tasks, 1000):
                await submit_all(intake_pb2_grpc.IntakeServiceStub(a_chan), a_specs[i : i + 1000])
                await submit_all(intake_pb2_grpc.IntakeServiceStub(b_chan), b_specs[i : i + 1000])
            async with worker.running():
                await worker.wait_started(2 * b_tasks, timeout_s)
    starts = first_starts(worker)
    out.started = len(starts)
    first = [s.device for s in starts[: out.counted]]
    out.share_one = sum(1 for d in first if d == b_mac) / out.counted
    out.share_many = 1 - out.share_one
    return out


def callers_rows(r: CallersResult) -> list[Row]:
    def ok(share: float) -> bool:
        return abs(share - CALLER_SHARE) <= CALLER_TOLERANCE

    return [
        Row(
            "callers",
            f"caller with {num(r.many_devices)} devices vs caller with 1, both backlogged",
            f"{r.share_many:.1%} / {r.share_one:.1%} of the first {num(r.counted)} tasks; "
            f"{r.started} / {2 * r.one_device_tasks} started",
            f"{CALLER_SHARE:.0%} +- {CALLER_TOLERANCE:.0%} each",
            ok(r.share_many) and ok(r.share_one),
            {
                "share_many_devices": r.share_many,
                "share_one_device": r.share_one,
                "counted": r.counted,
                "started": r.started,
                "tasks": 2 * r.one_device_tasks,
            },
        )
    ]


# --- claims (queue store only) ---------------------------------------------------------------------------------
async def claim_rate(devices: int, rounds: int) -> float:
    settings = Settings.from_env(
        {},
        redis_url=REDIS_URL,
        redis_prefix=f"bench-scale-{uuid.uuid4().hex[:6]}",
        max_total_pending=10**7,
        max_per_device_pending=10**6,
    )
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    queues = QueueStore(redis, settings)
    await queues.mark_rebuilt("bench")
    try:
        now = int(now_ms())
        per_device = max(2, (rounds * 10) // devices + 1)
        for start in range(0, devices, 1000):
            groups = {
                mac(0xEE, d): [Entry(f"{d}-{i}", 1, 3, now, now + 10**8) for i in range(per_device)]
                for d in range(start, min(devices, start + 1000))
            }
            await queues.enqueue_many(groups)
        t0 = time.perf_counter()
        for _ in range(rounds):
            claim = await queues.claim("bench", 10, {1: 10}, max_devices=1)
            assert claim.taken
            await queues.ack([(e.task_id, e.attempt) for _, p in claim.devices for e in p.taken])
        return rounds / (time.perf_counter() - t0)
    finally:
        await cleanup(settings)
        await redis.aclose()


async def claims(small: int = 10, large: int = 100_000, rounds: int = 3000) -> tuple[float, float]:
    await claim_rate(small, 500)  # warm up: connections, script cache
    return await claim_rate(small, rounds), await claim_rate(large, rounds)


def claims_rows(small_rate: float, large_rate: float, large: int = 100_000) -> list[Row]:
    return [
        Row(
            "claims",
            f"queue-store claim rounds/s, 10 vs {num(large)} active devices (Redis only)",
            f"{num(small_rate)} / {num(large_rate)} rounds/s = {large_rate / small_rate:.2f}",
            "context (bench_scale decides)",
            None,
            {"small_rounds_per_s": round(small_rate), "large_rounds_per_s": round(large_rate)},
        )
    ]


# --- command line ----------------------------------------------------------------------------------------------
ALL = ("noisy", "equal", "weights", "callers", "claims")


async def run(only: set[str], smoke: bool = False) -> list[Row]:
    from tests.benchmarks.sizes import FULL, SMOKE

    sizes = SMOKE if smoke else FULL
    rows: list[Row] = []
    if "noisy" in only:
        rows += noisy_rows(await noisy_neighbour(*sizes.noisy))
    if "equal" in only:
        rows += equal_rows(await equal_share(*sizes.equal))
    if "weights" in only:
        rows += weights_rows(await weights(*sizes.weights))
    if "callers" in only:
        rows += callers_rows(await callers(*sizes.callers))
    if "claims" in only:
        rows += claims_rows(
            *await claims(large=sizes.claims_large, rounds=sizes.claims_rounds), large=sizes.claims_large
        )
    return rows


if __name__ == "__main__":
    from tests.benchmarks.report import Report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(ALL))
    parser.add_argument("--smoke", action="store_true", help="small sizes (checks that it runs, not numbers)")
    args = parser.parse_args()
    report = Report(args.smoke, args.only.split(","))
    report.add(asyncio.run(run(set(args.only.split(",")), args.smoke)))
    print(report.table())
    raise SystemExit(1 if report.missed else 0)
