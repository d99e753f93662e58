"""Device scale end to end: the same number of text tasks over many devices with one task each, and over few
devices with many tasks each, through every service (registry, scheduler, intake and two worker processes, as
a user runs them, with credentials), side by side in one run.

    .venv/bin/python -m tests.benchmarks.bench_scale [--tasks 50000] [--few 100] [--pairs 1] [--workers 2]

- many: `tasks` devices x 1 task (the normal shape of a fleet: each device has a few tasks at a time);
- few:  `few` devices x `tasks / few` tasks.

Both cases do equal work: the same count of the same texts, submitted in the same shuffled order of
SubmitBatch calls (500 tasks each, 4 at a time) to a fresh cluster with the same settings (limits raised out
of the way of `tasks` queued at once), and the clock runs from the first submit until PostgreSQL holds the
last result. `pairs` alternating pairs (few first); the median of the pairs' ratios many / few is the result
(target >= 0.8: a hundred thousand small devices should be about as fast as a hundred big ones).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.bench_throughput import TEXTS
from tests.benchmarks.cluster import running_cluster
from tests.benchmarks.common import count_final, mac, submit_all, wait_final
from tests.benchmarks.report import Row, num
from tests.support.cluster import Cluster

TARGET = 0.8


@dataclass
class Case:
    """One end-to-end run of `devices` x `per_device` tasks."""

    devices: int
    per_device: int
    rate: float = 0.0
    submit_rate: float = 0.0
    seconds: float = 0.0
    succeeded: int = 0

    @property
    def tasks(self) -> int:
        return self.devices * self.per_device


@dataclass
class ScaleResult:
    tasks: int
    many: list[Case] = field(default_factory=list)
    few: list[Case] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Each pair's many / few (the two cases of a pair run back to back, so a slow spell of the machine
        weighs on both)."""
        return [m.rate / f.rate if f.rate else 0.0 for f, m in zip(self.few, self.many, strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the pairs' ratios."""
        return statistics.median(self.ratios) if self.ratios else 0.0


def workload(devices: int, per_device: int, seed: int = 1) -> list[intake_pb2.TaskSpec]:
    """`per_device` texts for each of `devices` devices, in one shuffled order (the same texts in both cases:
    the i-th task of the run gets the i-th text whatever its device)."""
    pairs = [(d, i) for d in range(devices) for i in range(per_device)]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    texts = random.Random(seed + 1)
    return [
        intake_pb2.TaskSpec(device_id=mac(0x60, d), type=types_pb2.TASK_TYPE_TEXT, text=f"{texts.choice(TEXTS)} {n}")
        for n, (d, _) in enumerate(pairs)
    ]


@contextlib.asynccontextmanager
async def cluster_for(cluster: Cluster | None, workers: int, tasks: int, per_device: int) -> AsyncIterator[Cluster]:
    """`cluster` when one is given (it must let `tasks` be queued at once), else a fresh one whose limits are
    out of the way of `tasks` queued at once over devices of `per_device` each."""
    if cluster is not None:
        yield cluster
        return
    async with running_cluster(
        workers=workers,
        SIEVE_MAX_TOTAL_PENDING=str(tasks + 1000),
        SIEVE_MAX_PER_DEVICE_PENDING=str(per_device + 10),
        SIEVE_CALLER_MAX_PENDING=str(tasks + 1000),
        SIEVE_CALLER_SUBMIT_RATE_PER_S="0",
    ) as fresh:
        yield fresh


async def run_case(
    devices: int,
    per_device: int,
    workers: int = 2,
    batch: int = 500,
    concurrency: int = 4,
    timeout_s: float = 900,
    cluster: Cluster | None = None,
) -> Case:
    """One case on a fresh cluster (or on `cluster`, for the smoke test: then only the counts mean anything)."""
    out = Case(devices, per_device)
    specs = workload(devices, per_device)
    tasks = len(specs)
    async with cluster_for(cluster, workers, tasks, per_device) as c:
        s = c.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        try:
            before, succeeded_before = await count_final(pg), await count_final(pg, ("SUCCEEDED",))
            async with rpc.channel(s.intake_addr, s) as channel:
                stub = intake_pb2_grpc.IntakeServiceStub(channel)
                t0 = time.perf_counter()
                await submit_all(stub, specs, chunk=batch, concurrency=concurrency)
                submitted = time.perf_counter() - t0
                done = await wait_final(pg, before + tasks, timeout_s)
            out.seconds = done - t0
            out.rate, out.submit_rate = tasks / out.seconds, tasks / submitted
            out.succeeded = await count_final(pg, ("SUCCEEDED",)) - succeeded_before
        finally:
            await pg.close()
    return out


async def measure(
    tasks: int = 50000, few: int = 100, pairs: int = 1, workers: int = 2, timeout_s: float = 900
) -> ScaleResult:
    out = ScaleResult(tasks)
    for _ in range(pairs):
        out.few.append(await run_case(few, tasks // few, workers, timeout_s=timeout_s))
        out.many.append(await run_case(tasks, 1, workers, timeout_s=timeout_s))
    return out


def describe(case: Case) -> str:
    return (
        f"{num(case.devices)} devices x {num(case.per_device)}: submitted at {case.submit_rate:.0f}/s, "
        f"{case.succeeded} succeeded in {case.seconds:.2f}s -> {case.rate:.0f} tasks/s end to end"
    )


def rows(r: ScaleResult) -> list[Row]:
    few = statistics.median(c.rate for c in r.few) if r.few else 0.0
    many = statistics.median(c.rate for c in r.many) if r.many else 0.0
    f, m = (r.few[0], r.many[0]) if r.few and r.many else (Case(0, 0), Case(0, 0))
    done = all(c.succeeded == c.tasks for c in r.few + r.many)
    values = {
        "many_tasks_per_s": round(many),
        "few_tasks_per_s": round(few),
        "ratio": round(r.ratio, 3),
        "pair_ratios": [round(x, 3) for x in r.ratios],
        "many_devices": m.devices,
        "few_devices": f.devices,
        "few_per_device": f.per_device,
        "many_submit_per_s": [round(c.submit_rate) for c in r.many],
        "few_submit_per_s": [round(c.submit_rate) for c in r.few],
        "succeeded": [c.succeeded for c in r.few + r.many],
        "tasks": r.tasks,
        "pairs": len(r.few),
    }
    return [
        Row(
            "scale",
            f"{num(m.devices)} devices x 1 vs {num(f.devices)} devices x {num(f.per_device)}, e2e",
            f"{num(many)} / {num(few)} tasks/s (medians); pairs "
            + ", ".join(f"{x:.2f}" for x in r.ratios)
            + f": median {r.ratio:.2f}",
            f">= {TARGET}",
            r.ratio >= TARGET,
            values,
        ),
        Row(
            "scale",
            "every task of both cases succeeded",
            " / ".join(f"{c.succeeded} of {c.tasks}" for c in r.few + r.many),
            "all",
            done,
            values,
        ),
    ]


async def main(args: argparse.Namespace) -> int:
    result = await measure(args.tasks, args.few, args.pairs, args.workers)
    for few, many in zip(result.few, result.many, strict=True):
        print(f"  few:  {describe(few)}\n  many: {describe(many)}")
    print(
        f"ratio many / few, median of the pairs' ({', '.join(f'{x:.2f}' for x in result.ratios)}): "
        f"{result.ratio:.2f} (target >= {TARGET})"
    )
    return 0 if result.ratio >= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=50000)
    parser.add_argument("--few", type=int, default=100, help="devices of the few-devices case")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    sys.exit(asyncio.run(main(parser.parse_args())))
