"""What the benchmarks share: device ids, batched submits, waiting for PostgreSQL to hold the results, per-task
timings read back from the record, percentiles and Jain's fairness index."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.request import urlopen

import asyncpg
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from worker_svc.runner import NOT_WORKER_TIME

#: the most tasks one SubmitBatch takes (intake_svc.validation.MAX_BATCH)
MAX_BATCH = 1000
FINAL = ("SUCCEEDED", "FAILED", "DEAD_LETTERED", "EXPIRED", "CANCELLED")


def mac(prefix: int, i: int) -> str:
    """The i-th device of a benchmark's own range (`prefix` is its first byte; up to 2**24 devices)."""
    return f"{prefix:02X}:00:00:{i >> 16 & 255:02X}:{i >> 8 & 255:02X}:{i & 255:02X}"


def text(device: str, i: int, body: str = "task") -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=f"{body} {i}")


async def submit_all(
    stub: intake_pb2_grpc.IntakeServiceStub,
    specs: Sequence[intake_pb2.TaskSpec],
    chunk: int = MAX_BATCH,
    concurrency: int = 1,
) -> None:
    """Submits every spec in SubmitBatch calls of `chunk`, `concurrency` calls at a time; any refused item is an
    error (benchmarks raise the limits out of their way)."""
    sem = asyncio.Semaphore(concurrency)

    async def send(batch: Sequence[intake_pb2.TaskSpec]) -> None:
        async with sem:
            reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=batch))
            refused = [item for item in reply.items if item.code != 0]
            if refused:
                raise AssertionError(f"{len(refused)} of {len(batch)} refused: {refused[0].message}")

    await asyncio.gather(*(send(specs[i : i + chunk]) for i in range(0, len(specs), chunk)))


async def count_final(pg: asyncpg.Connection, statuses: Sequence[str] = FINAL) -> int:
    return await pg.fetchval("SELECT count(*) FROM tasks WHERE status = ANY($1::text[])", list(statuses))


#: the longest and shortest sleep between two looks of wait_final (s)
POLL_MAX_S, POLL_MIN_S = 0.25, 0.02


async def wait_final(pg: asyncpg.Connection, target: int, timeout_s: float, statuses: Sequence[str] = FINAL) -> float:
    """Waits until PostgreSQL holds `target` tasks in one of `statuses`; returns the perf_counter time it saw
    them. Raises TimeoutError (naming how many were there) after `timeout_s`.

    Each look is a count over the whole task table (a 50 000-task table takes PostgreSQL about 20 ms of CPU), so
    looking every 50 ms would spend a tenth of a core on the benchmark's own clock, which the side it is compared
    with (a Redis counter read) does not. It looks again after half the time the rate seen so far says is left
    (between POLL_MIN_S and POLL_MAX_S): a few looks while most of the work is ahead, one every POLL_MIN_S at the
    end, so that the clock stops within about POLL_MIN_S of the last task."""
    began = time.perf_counter()
    deadline = began + timeout_s
    first: int | None = None
    while True:
        done = await count_final(pg, statuses)
        now = time.perf_counter()
        if done >= target:
            return now
        if now > deadline:
            raise TimeoutError(f"{done} of {target} tasks final after {timeout_s:.0f}s")
        if first is None:
            first = done
        rate = (done - first) / (now - began) if now > began else 0.0
        left_s = (target - done) / rate if rate > 0 else POLL_MAX_S
        await asyncio.sleep(min(POLL_MAX_S, max(POLL_MIN_S, left_s / 2)))


@dataclass(frozen=True, slots=True)
class TaskTiming:
    """One task as the record tells it: when it was submitted, when it first left PENDING (the first hand-out
    the record shows: ASSIGNED or RUNNING, or its final status when neither was written), when it ended, and
    the worker time its result names (the sum of the stages of `details.timings_ms` that use the worker: decode,
    detect, recognise, match — not `queue`, the wait for the engine, `fetch`, a download, or `total`; 0
    without a result)."""

    device: str
    caller: str
    status: str
    submitted_s: float
    started_s: float
    ended_s: float
    worker_ms: float


async def task_timings(pg: asyncpg.Connection, device_prefix: str = "") -> list[TaskTiming]:
    """Every task (of devices starting with `device_prefix`), with its times in epoch seconds."""
    rows = await pg.fetch(
        """SELECT t.device, t.caller, t.status, extract(epoch FROM t.created_at) AS submitted,
                  extract(epoch FROM t.updated_at) AS updated, t.history::text AS history,
                  r.details::text AS details
           FROM tasks t LEFT JOIN results r ON r.task_id = t.id WHERE t.device LIKE $1""",
        device_prefix + "%",
    )
    out = []
    for row in rows:
        history = json.loads(row["history"])
        moves = [_epoch(h["at"]) for h in history if h.get("status") not in ("PENDING", None)]
        started = min(moves) if moves else float(row["updated"])
        ended = max(moves) if moves else float(row["updated"])
        timings = json.loads(row["details"]).get("timings_ms", {}) if row["details"] else {}
        out.append(
            TaskTiming(
                row["device"],
                row["caller"],
                row["status"],
                float(row["submitted"]),
                started,
                ended,
                float(sum(v for k, v in timings.items() if k not in NOT_WORKER_TIME and isinstance(v, int | float))),
            )
        )
    return out


def _epoch(at: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(at).timestamp()


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def jain(counts: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when every count is equal, 1/n when one holds everything."""
    total = sum(counts)
    return total * total / (len(counts) * sum(c * c for c in counts)) if total else 1.0


def metric_samples(address: str, timeout_s: float = 10) -> list[Sample]:
    """Every sample a service's metrics port at `address` serves now (blocking: call it in a thread)."""
    with urlopen(f"http://{address}/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _submit_steps(address: str) -> dict[str, tuple[float, float]]:
    steps: dict[str, list[float]] = {}
    for sample in metric_samples(address):
        if sample.name in ("sieve_submit_step_seconds_sum", "sieve_submit_step_seconds_count"):
            pair = steps.setdefault(sample.labels["step"], [0.0, 0.0])
            pair[sample.name.endswith("_count")] += sample.value
    return {step: (total, count) for step, (total, count) in steps.items()}


async def submit_steps(address: str) -> dict[str, tuple[float, float]]:
    """The intake's `sieve_submit_step_seconds` at `address` (its metrics port): step -> (seconds, calls) so far."""
    return await asyncio.to_thread(_submit_steps, address)


def step_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each step's mean seconds per call between two `submit_steps` readings."""
    means = {}
    for step, (total, count) in after.items():
        total0, count0 = before.get(step, (0.0, 0.0))
        if count > count0:
            means[step] = (total - total0) / (count - count0)
    return means
