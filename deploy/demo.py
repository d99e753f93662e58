"""A demo client of a running Sieve: submits text tasks from many devices, waits for them, prints a summary.

Owns the demo that `deploy/run_local.py` runs (and that can be run alone against any intake):
`python deploy/demo.py --addr 127.0.0.1:50051 --tasks 400 --devices 40 --token "$SIEVE_CLIENT_TOKEN"`.

It sends `--tasks` TEXT tasks, spread over `--devices` random MAC addresses (written in several spellings),
with `IntakeService.SubmitBatch` in batches of 50, then polls `GetTask` until every task is final or the
timeout passes, and prints counts per status and verdict, the ten most frequent hit words, throughput and
the Submit-to-result latency (p50 / p99 of updated_at - created_at). Exit status 0 only when every task
SUCCEEDED.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import random
import sys
import time
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

import grpc

if __package__ in (None, ""):  # run as a script: make the repository's `sieve` package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sieve import rpc
from sieve.enums import enum_name
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2

BATCH_SIZE = 50
POLL_CONCURRENCY = 32
#: Retries of items refused with RESOURCE_EXHAUSTED (the server's backlog is full): wait, then resend.
MAX_RESUBMITS = 3

FINAL_STATUSES = frozenset(
    {
        types_pb2.TASK_STATUS_SUCCEEDED,
        types_pb2.TASK_STATUS_FAILED,
        types_pb2.TASK_STATUS_EXPIRED,
        types_pb2.TASK_STATUS_CANCELLED,
        types_pb2.TASK_STATUS_DEAD_LETTERED,
    }
)

#: Sample texts: clean ones, plain lexicon words, and words hidden by spacing, punctuation, width or case.
SAMPLE_TEXTS: tuple[str, ...] = (
    "今天天气很好，我们去公园散步吧。",
    "会议改到下午三点，请大家准时参加。",
    "这家餐厅的牛肉面非常好吃，推荐给大家。",
    "周末一起去图书馆看书吗？",
    "新版本已经发布，欢迎下载体验。",
    "The quarterly report is attached, please review it before Friday.",
    "Our team won the football match last night!",
    "Remember to water the plants while I am away.",
    "The new coffee machine in the kitchen works great.",
    "Happy birthday! Wishing you a wonderful year ahead.",
    "想赚钱请加 微 信 abc123，日赚千元不是梦！",
    "加.微.信领取福利，名额有限",
    "网上赌.博输光了所有积蓄，千万别碰",
    "六合彩内部资料，稳赚不赔",
    "ｃａｓｉｎｏ bonus for new players, sign up today",
    "Best CaSiNo in town, free money for everyone",
    "免费领取iPhone，点击领取，先到先得",
    "扫码领红包，兼职日结，在家就能做",
    "出售仿真枪和管制刀具，私聊",
    "专业办假证，各类证件都能做",
    "click here to claim your prize, limited time offer!",
    "buy followers cheap, 10k for $5",
    "Looking for an escort service tonight?",
    "phishing emails pretend to come from your bank",
    "冰-毒 和 海 洛 因 都是毒品，远离它们",
    "信用卡套现，网贷秒批，当天到账",
    "这是一条包含敏感词的测试消息",
    "杀 猪 盘 诈骗 新手法曝光，大家提高警惕",
    "Sports Betting tips: 100% win rate, join now",
    "下午茶时间到了，有人要一起吗？",
)


@dataclass
class DemoReport:
    """What the demo saw; `ok` is True only when every task SUCCEEDED."""

    submitted: int = 0
    refused: list[str] = field(default_factory=list)
    tasks: dict[str, types_pb2.Task] = field(default_factory=dict)
    timed_out: bool = False
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            not self.refused
            and not self.timed_out
            and bool(self.tasks)
            and all(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in self.tasks.values())
        )


def random_mac(rng: random.Random) -> str:
    """A random locally administered unicast MAC, AA:BB:CC:DD:EE:FF."""
    octets = [rng.randrange(256) for _ in range(6)]
    octets[0] = (octets[0] | 0x02) & 0xFE
    return ":".join(f"{o:02X}" for o in octets)


def spell_mac(mac: str, rng: random.Random) -> str:
    """The same MAC in one of the spellings the intake accepts."""
    digits = mac.replace(":", "")
    style = rng.randrange(4)
    if style == 1:
        return mac.replace(":", "-")
    if style == 2:
        return ".".join(digits[i : i + 4] for i in range(0, 12, 4)).lower()
    if style == 3:
        return digits
    return mac.lower() if rng.random() < 0.5 else mac


def build_specs(tasks: int, devices: int, rng: random.Random) -> list[intake_pb2.TaskSpec]:
    macs = [random_mac(rng) for _ in range(max(1, devices))]
    return [
        intake_pb2.TaskSpec(
            device_id=spell_mac(rng.choice(macs), rng),
            type=types_pb2.TASK_TYPE_TEXT,
            text=rng.choice(SAMPLE_TEXTS),
            idempotency_key=uuid.uuid4().hex,
        )
        for _ in range(tasks)
    ]


async def submit_all(
    stub: intake_pb2_grpc.IntakeServiceStub,
    specs: Sequence[intake_pb2.TaskSpec],
    metadata: Sequence[tuple[str, str]],
    report: DemoReport,
) -> None:
    """Sends the specs in batches; items refused for a full backlog are sent again after retry_after."""
    for start in range(0, len(specs), BATCH_SIZE):
        pending = list(specs[start : start + BATCH_SIZE])
        for attempt in range(MAX_RESUBMITS + 1):
            response = await stub.SubmitBatch(
                intake_pb2.SubmitBatchRequest(tasks=pending), metadata=metadata, timeout=30
            )
            retry: list[intake_pb2.TaskSpec] = []
            wait_s = 0.0
            for spec, item in zip(pending, response.items, strict=True):
                if item.code == grpc.StatusCode.OK.value[0] and item.HasField("task"):
                    report.tasks[item.task.task_id] = item.task
                    report.submitted += 1
                elif item.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and attempt < MAX_RESUBMITS:
                    retry.append(spec)
                    wait_s = max(wait_s, item.retry_after.ToTimedelta().total_seconds())
                else:
                    report.refused.append(f"{spec.device_id}: code {item.code}: {item.message}")
            if not retry:
                break
            await asyncio.sleep(min(max(wait_s, 0.5), 5.0))
            pending = retry


async def poll_until_final(
    stub: intake_pb2_grpc.IntakeServiceStub, metadata: Sequence[tuple[str, str]], report: DemoReport, deadline: float
) -> None:
    """GetTask on every unfinished task, round after round, until all are final or the deadline passes."""
    gate = asyncio.Semaphore(POLL_CONCURRENCY)

    async def refresh(task_id: str) -> None:
        async with gate:
            try:
                response = await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), metadata=metadata, timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return  # try again next round
                raise
            report.tasks[task_id] = response.task

    while True:
        open_ids = [tid for tid, t in report.tasks.items() if t.status not in FINAL_STATUSES]
        if not open_ids:
            return
        if time.monotonic() >= deadline:
            report.timed_out = True
            return
        await asyncio.gather(*(refresh(tid) for tid in open_ids))
        if any(t.status not in FINAL_STATUSES for t in report.tasks.values()):
            await asyncio.sleep(0.2)


async def run_demo(
    settings: Settings, tasks: int = 400, devices: int = 40, timeout_s: float = 120.0, seed: int | None = None
) -> DemoReport:
    """Submits `tasks` texts over `devices` devices to the intake at `settings.intake_addr` (with its token and
    TLS settings) and waits for their results."""
    rng = random.Random(seed)
    metadata: list[tuple[str, str]] = []  # the channel adds the token
    report = DemoReport()
    specs = build_specs(tasks, devices, rng)
    started = time.monotonic()
    async with rpc.channel(settings.intake_addr, settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        await submit_all(stub, specs, metadata, report)
        await poll_until_final(stub, metadata, report, started + timeout_s)
    report.elapsed_s = time.monotonic() - started
    return report


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of `values` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def _pad(text: str, width: int) -> str:
    """`text` left-aligned in `width` terminal columns (CJK and full-width characters take two)."""
    columns = sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)
    return text + " " * max(0, width - columns)


def print_summary(report: DemoReport, out: TextIO | None = None) -> None:
    """Prints the summary tables of a demo run."""
    stream = out if out is not None else sys.stdout

    def say(line: str = "") -> None:
        print(line, file=stream)

    tasks = list(report.tasks.values())
    statuses = collections.Counter(enum_name(types_pb2.TaskStatus, t.status) for t in tasks)
    succeeded = [t for t in tasks if t.status == types_pb2.TASK_STATUS_SUCCEEDED]
    verdicts = collections.Counter(enum_name(types_pb2.Verdict, t.result.verdict) for t in succeeded)
    words = collections.Counter(hit.word for t in succeeded for hit in t.result.hits)
    latencies = [(t.updated_at.ToDatetime() - t.created_at.ToDatetime()).total_seconds() for t in succeeded]

    say("=" * 60)
    say("Sieve demo summary")
    say("=" * 60)
    say(
        f"submitted {report.submitted}, refused {len(report.refused)}"
        + (", TIMED OUT waiting for results" if report.timed_out else "")
    )
    for line in report.refused[:10]:
        say(f"  refused: {line}")
    say()
    say(f"{'status':<16}{'tasks':>8}")
    for name, count in statuses.most_common():
        say(f"{name:<16}{count:>8}")
    say()
    say(f"{'verdict':<16}{'tasks':>8}")
    for name in ("PASS", "REVIEW", "BLOCK", "UNSPECIFIED"):
        if verdicts[name]:
            say(f"{name:<16}{verdicts[name]:>8}")
    say()
    say(f"{'top hit words':<24}{'hits':>8}")
    for word, count in words.most_common(10):
        say(f"{_pad(word, 24)}{count:>8}")
    say()
    rate = len(succeeded) / report.elapsed_s if report.elapsed_s > 0 else 0.0
    say(f"elapsed {report.elapsed_s:.2f} s, {rate:.1f} tasks/s")
    say(
        f"submit->result latency p50 {percentile(latencies, 50) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 99) * 1000:.0f} ms"
    )
    failed = [t for t in tasks if t.status != types_pb2.TASK_STATUS_SUCCEEDED]
    for t in failed[:5]:
        say(f"  not succeeded: {t.task_id} {types_pb2.TaskStatus.Name(t.status)} {t.error}")
    say("RESULT: " + ("OK, every task succeeded" if report.ok else "FAILED, not every task succeeded"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Sieve demo client: submit text tasks and summarise their results.")
    parser.add_argument(
        "--addr",
        default=os.environ.get("SIEVE_INTAKE_ADDR", "127.0.0.1:50051"),
        help="intake address (default: SIEVE_INTAKE_ADDR or 127.0.0.1:50051)",
    )
    parser.add_argument("--tasks", type=int, default=400, help="texts to submit (default 400)")
    parser.add_argument("--devices", type=int, default=40, help="distinct device MACs (default 40)")
    parser.add_argument(
        "--token",
        default=os.environ.get("SIEVE_CLIENT_TOKEN", ""),
        help="client token sent as 'Bearer <token>' (default: SIEVE_CLIENT_TOKEN)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for all results")
    parser.add_argument("--seed", type=int, default=None, help="random seed, for a repeatable demo")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.devices < 1:
        parser.error("--tasks and --devices must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = asyncio.run(
            run_demo(
                Settings.from_env(intake_addr=args.addr, auth_token=args.token),
                args.tasks,
                args.devices,
                args.timeout,
                args.seed,
            )
        )
    except grpc.aio.AioRpcError as exc:
        print(f"demo: RPC failed: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    print_summary(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
