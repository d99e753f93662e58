"""Fair by cost: two devices whose OCR tasks differ about 10x in cost, both backlogged, share one OCR worker's
time — not its hand-outs — within +-10 % of each other.

    .venv/bin/python -m tests.benchmarks.bench_cost [--seconds 60] [--large 200] [--small 1500]

Every service is a process (registry, scheduler, intake, one CPU OCR worker, every setting its default but the
pending limits, raised out of the way of the backlog). Device L queues `large` images of 6 lines of Chinese and
English text (about 0.4 s of engine time each on a CPU core), device S queues `small` images of one short word
(about 0.04 s). The worker runs for `seconds`; then the record is read back: each task's worker time is the sum
of the stage timings its result names (`details.timings_ms`: decode, detect, recognise, match; not the
wait for the engine), and the window is
the time both devices were backlogged (from the first hand-out until the measurement stopped or the first device
had its last task). Shares of worker time in that window: counting hand-outs gives L about 10 times S's share;
charging devices for what their tasks cost gives each about half (target: the smaller share >= 0.9 x the larger).
Both backlogs outlast the window under either rule (S has more than ten times L's tasks).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field

import asyncpg

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.cluster import running_cluster
from tests.benchmarks.common import TaskTiming, mac, submit_all, task_timings
from tests.benchmarks.report import Row, num
from tests.ocr_samples import Sample, find_cjk_font, render

TARGET = 0.9
LARGE, SMALL = mac(0x70, 1), mac(0x70, 2)


def images(font: str) -> tuple[bytes, bytes]:
    """(large, small): 6 lines at 40 px, one word at 32 px."""
    lines = tuple(f"第{i}行 今天天气很好 The weather is nice {i}" for i in range(6))
    return render(Sample(lines), font, 40), render(Sample(("你好",)), font, 32)


@dataclass
class DeviceShare:
    device: str
    queued: int
    done: int = 0
    worker_ms: float = 0.0
    share: float = 0.0

    @property
    def mean_ms(self) -> float:
        return self.worker_ms / self.done if self.done else 0.0


@dataclass
class CostResult:
    seconds: float
    window_s: float = 0.0
    devices: list[DeviceShare] = field(default_factory=list)
    failed: int = 0

    @property
    def ratio(self) -> float:
        shares = [d.share for d in self.devices]
        return min(shares) / max(shares) if shares and max(shares) > 0 else 0.0

    @property
    def cost_ratio(self) -> float:
        large, small = self.devices
        return large.mean_ms / small.mean_ms if small.mean_ms else 0.0


def shares(timings: list[TaskTiming], queued: dict[str, int], stopped_at: float) -> CostResult:
    """Worker-time shares of each device over the time all of them were backlogged."""
    out = CostResult(0.0)
    ran = [t for t in timings if t.status != "PENDING" and t.started_s <= stopped_at]
    if not ran:
        out.devices = [DeviceShare(d, n) for d, n in queued.items()]
        return out
    begin = min(t.started_s for t in ran)
    end = stopped_at
    for device in queued:
        mine = [t for t in timings if t.device == device]
        if all(t.status in ("SUCCEEDED", "FAILED") for t in mine):  # it ran out: the window ends there
            end = min(end, max(t.started_s for t in mine))
    out.window_s = end - begin
    for device, count in queued.items():
        done = [t for t in ran if t.device == device and t.status == "SUCCEEDED" and t.started_s <= end]
        out.devices.append(DeviceShare(device, count, len(done), sum(t.worker_ms for t in done)))
    total = sum(d.worker_ms for d in out.devices)
    for d in out.devices:
        d.share = d.worker_ms / total if total else 0.0
    out.failed = sum(1 for t in ran if t.status == "FAILED")
    return out


async def measure(seconds: float = 60, large: int = 200, small: int = 1500) -> CostResult:
    font = find_cjk_font()
    if font is None:
        raise RuntimeError("no CJK font: install fonts-wqy-microhei or fonts-noto-cjk")
    large_image, small_image = images(font)
    queued = {LARGE: large, SMALL: small}
    worker_env = {"SIEVE_WORKER_TASK_TYPES": "OCR_IMAGE", "SIEVE_OCR_DEVICE": "cpu"}
    total = large + small
    async with running_cluster(
        workers=1,
        worker_env=worker_env,
        SIEVE_MAX_TOTAL_PENDING=str(total + 1000),
        SIEVE_MAX_PER_DEVICE_PENDING=str(max(large, small) + 10),
        SIEVE_CALLER_MAX_PENDING=str(total + 1000),
    ) as cluster:
        s = cluster.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        try:
            async with rpc.channel(s.intake_addr, s) as channel:
                stub = intake_pb2_grpc.IntakeServiceStub(channel)
                big = [
                    intake_pb2.TaskSpec(device_id=LARGE, type=types_pb2.TASK_TYPE_OCR_IMAGE, image=large_image)
                    for _ in range(large)
                ]
                little = [
                    intake_pb2.TaskSpec(device_id=SMALL, type=types_pb2.TASK_TYPE_OCR_IMAGE, image=small_image)
                    for _ in range(small)
                ]
                # the first call queues both devices: both are backlogged from the worker's first claim on
                await submit_all(stub, big[:10] + little[:10])
                await submit_all(stub, big[10:] + little[10:], chunk=100)
                await asyncio.sleep(seconds)
                stopped_at = time.time()
            timings = await task_timings(pg, "70:00:00:")
        finally:
            await pg.close()
    out = shares(timings, queued, stopped_at)
    out.seconds = seconds
    return out


def rows(r: CostResult) -> list[Row]:
    large, small = r.devices
    values = {
        "large_share": round(large.share, 4),
        "small_share": round(small.share, 4),
        "large_worker_ms": round(large.worker_ms),
        "small_worker_ms": round(small.worker_ms),
        "large_done": large.done,
        "small_done": small.done,
        "large_mean_ms": round(large.mean_ms, 1),
        "small_mean_ms": round(small.mean_ms, 1),
        "window_s": round(r.window_s, 1),
        "failed": r.failed,
    }
    return [
        Row(
            "cost",
            f"worker-time shares, two backlogged devices whose tasks differ {r.cost_ratio:.1f}x in cost",
            f"{large.share:.1%} / {small.share:.1%} (tasks {large.done} / {small.done}, mean "
            f"{large.mean_ms:.0f} / {small.mean_ms:.0f} ms) over {r.window_s:.0f} s",
            f"smaller >= {TARGET} x larger (+-10 %)",
            r.ratio >= TARGET and large.done > 0 and small.done > 0,
            values,
            note="" if r.failed == 0 else f"{r.failed} tasks FAILED",
        )
    ]


def describe(r: CostResult) -> str:
    return "\n".join(
        f"  {d.device}: {d.done} of {d.queued} done, worker time {num(d.worker_ms)} ms "
        f"(mean {d.mean_ms:.0f} ms), share {d.share:.1%}"
        for d in r.devices
    ) + (f"\nwindow {r.window_s:.1f}s; smaller share / larger {r.ratio:.2f} (target >= {TARGET})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--large", type=int, default=200)
    parser.add_argument("--small", type=int, default=1500)
    args = parser.parse_args()
    result = asyncio.run(measure(args.seconds, args.large, args.small))
    print(describe(result))
    sys.exit(0 if result.ratio >= TARGET else 1)
