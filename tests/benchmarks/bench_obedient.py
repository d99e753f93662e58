"""An obedient client against the default admission limits: does honouring every retry_after keep Sieve busy?

    .venv/bin/python -m tests.benchmarks.bench_obedient [--tasks 20000] [--devices 200] [--batch 500]
                                                         [--concurrency 4] [--workers 2] [--pairs 1]

The client submits `tasks` texts over `devices` devices in SubmitBatch calls of `batch`, `concurrency` calls at
a time; every item refused with RESOURCE_EXHAUSTED is submitted again, alone with the other refused items of its
call, after the longest retry_after among them (it never comes back earlier than told, and never retries
anything else). The clock runs from the first call until PostgreSQL holds the last result.

(a) default settings: 5 000 pending in all, 200 per device, retry_after_s 30 (the most a refusal may say);
(b) the same with the limits raised out of the way (nothing is ever refused).

Each side runs on a fresh cluster (every service a process, `workers` text workers), `pairs` times, alternating.
Prints both rates, the refusals and the delays they said, and the ratio (a)/(b); exits 1 when the median ratio
is under 0.8 (the target: a client that does as it is told still gets >= 0.8 x the throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
import grpc

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.cluster import running_cluster
from tests.benchmarks.common import wait_final
from tests.benchmarks.report import Row, num

TARGET = 0.8
#: the longest a run may take before it counts as failed (results counted in PostgreSQL)
TIMEOUT_S = 900
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


@dataclass
class Run:
    rate: float = 0.0
    seconds: float = 0.0
    calls: int = 0
    refused: int = 0
    told_s: list[float] = field(default_factory=list)


@dataclass
class Load:
    """The client's workload: `tasks` texts over `devices` devices, SubmitBatch calls of `batch`, `concurrency`
    calls at a time, against `workers` text workers."""

    tasks: int = 20000
    devices: int = 200
    batch: int = 500
    concurrency: int = 4
    workers: int = 2


async def obedient_run(args: Load, limits: dict[str, str]) -> Run:
    run = Run()
    async with running_cluster(workers=args.workers, **limits) as cluster:
        s = cluster.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        rng = random.Random(1)
        specs = [
            intake_pb2.TaskSpec(
                device_id=f"50:00:00:00:{d // 256:02x}:{d % 256:02x}",
                type=types_pb2.TASK_TYPE_TEXT,
                text=f"obedient {i}",
            )
            for i, d in enumerate(rng.randrange(args.devices) for _ in range(args.tasks))
        ]
        batches = [specs[i : i + args.batch] for i in range(0, len(specs), args.batch)]
        async with rpc.channel(s.intake_addr, s) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            queue: asyncio.Queue[list[intake_pb2.TaskSpec]] = asyncio.Queue()
            for b in batches:
                queue.put_nowait(b)

            async def client() -> None:
                while not queue.empty():
                    batch = queue.get_nowait()
                    while batch:
                        reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=batch))
                        run.calls += 1
                        refused = [
                            (spec, item)
                            for spec, item in zip(batch, reply.items, strict=True)
                            if item.code == EXHAUSTED
                        ]
                        other = [item for item in reply.items if item.code not in (0, EXHAUSTED)]
                        assert not other, other[0].message
                        if not refused:
                            break
                        told = max(item.retry_after.ToMilliseconds() / 1000 for _, item in refused)
                        run.refused += len(refused)
                        run.told_s.append(told)
                        batch = [spec for spec, _ in refused]
                        await asyncio.sleep(told)

            began = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(args.concurrency)))
            run.seconds = await wait_final(pg, args.tasks, TIMEOUT_S, statuses=("SUCCEEDED",)) - began
            run.rate = args.tasks / run.seconds
        await pg.close()
    return run


def describe(name: str, run: Run) -> str:
    told = (
        f"; retry_after told: median {statistics.median(run.told_s):.2f}s, max {max(run.told_s):.2f}s"
        if run.told_s
        else ""
    )
    return (
        f"  {name}: {run.rate:7.0f} tasks/s ({run.seconds:.1f}s, {run.calls} calls, {run.refused} items refused{told})"
    )


@dataclass
class ObedientResult:
    """Each pair: (a) default limits, (b) limits raised; `ratio` is the median of (a)/(b)."""

    load: Load
    pairs: list[tuple[Run, Run]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.median(a.rate / b.rate for a, b in self.pairs) if self.pairs else 0.0


async def measure(load: Load, pairs: int = 1, log: Callable[[str], None] = print) -> ObedientResult:
    out = ObedientResult(load)
    raised = {
        "SIEVE_MAX_TOTAL_PENDING": str(load.tasks + 1000),
        "SIEVE_MAX_PER_DEVICE_PENDING": str(load.tasks),
        "SIEVE_CALLER_MAX_PENDING": str(load.tasks + 1000),
    }
    log(
        f"{load.tasks} texts over {load.devices} devices, batches of {load.batch}, {load.concurrency} at a time, "
        f"{load.workers} workers; the client honours every retry_after"
    )
    for pair in range(pairs):
        default = await obedient_run(load, {})
        lifted = await obedient_run(load, raised)
        out.pairs.append((default, lifted))
        log(f"pair {pair + 1}:")
        log(describe("(a) default limits (5 000 / 200)", default))
        log(describe("(b) limits raised              ", lifted))
        log(f"  ratio (a)/(b): {default.rate / lifted.rate:.2f}")
    return out


def rows(r: ObedientResult) -> list[Row]:
    a = statistics.median(p[0].rate for p in r.pairs) if r.pairs else 0.0
    b = statistics.median(p[1].rate for p in r.pairs) if r.pairs else 0.0
    refused = sum(p[0].refused for p in r.pairs)
    return [
        Row(
            "obedient",
            f"client honouring every retry_after, default limits vs raised ({num(r.load.tasks)} tasks)",
            f"{num(a)} / {num(b)} tasks/s = {r.ratio:.2f} ({num(refused)} items refused and resubmitted)",
            f">= {TARGET}",
            r.ratio >= TARGET,
            {
                "default_tasks_per_s": round(a),
                "raised_tasks_per_s": round(b),
                "ratio": round(r.ratio, 3),
                "refused": refused,
                "pairs": len(r.pairs),
            },
        )
    ]


async def main(args: argparse.Namespace) -> int:
    load = Load(args.tasks, args.devices, args.batch, args.concurrency, args.workers)
    ratio = (await measure(load, args.pairs)).ratio
    print(f"median ratio (a)/(b): {ratio:.2f} (target >= {TARGET})")
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=1)
    sys.exit(asyncio.run(main(parser.parse_args())))
