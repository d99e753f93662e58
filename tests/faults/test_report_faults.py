"""ReportDetection under kill -9: twenty clients report 1 500 detections of their devices, each retrying a call that
failed (UNAVAILABLE, DEADLINE_EXCEEDED) with the same report_id, while the intake is killed three times and
started again. Every report is stored exactly once, every client gets an answer for each of its reports, and the
answer is the stored record — a call whose store committed but whose answer was lost is answered, on its retry,
with that record (`deduplicated`)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from google.protobuf import timestamp_pb2

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.faults.harness import FAST_ENV, kill9
from tests.support.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

CLIENTS = 20
PER_CLIENT = 75


def _report(client: int, n: int, at: timestamp_pb2.Timestamp) -> intake_pb2.ReportDetectionRequest:
    text = f"device {client} saw 赌博 {n}"
    start = text.index("赌博")
    return intake_pb2.ReportDetectionRequest(
        device_id=f"0F:00:00:00:{client:02x}:00",
        report_id=f"r-{client}-{n}",
        detected_at=at,
        text=text,
        verdict=types_pb2.VERDICT_BLOCK,
        hits=[
            types_pb2.Hit(word="赌博", category="gambling", severity=3, start=start, end=start + 2, matched_text="赌博")
        ],
    )


async def test_reports_under_three_intake_kills_are_stored_once_and_each_answered_with_its_record(
    fault_cluster: Cluster, pg: asyncpg.Pool
) -> None:
    c = fault_cluster
    c.env.update(FAST_ENV)
    c.start("registry", "registry_svc")
    await c.wait_healthy(c.settings.registry_addr, "registry")
    c.start("scheduler", "scheduler_svc")
    await c.wait_healthy(c.settings.scheduler_addr, "scheduler")
    c.start("intake", "intake_svc")
    await c.wait_healthy(c.settings.intake_addr, "intake")
    at = timestamp_pb2.Timestamp()
    at.FromDatetime(datetime.now(UTC) - timedelta(minutes=1))
    answers: dict[str, intake_pb2.ReportDetectionResponse] = {}
    retries = 0

    async def client(k: int) -> None:
        nonlocal retries
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            for n in range(PER_CLIENT):
                request = _report(k, n, at)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        answers[request.report_id] = await stub.ReportDetection(request, timeout=5)
                        break
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
                        assert time.monotonic() < deadline, "intake stayed unavailable"
                        retries += 1
                        await asyncio.sleep(0.1)

    running = asyncio.gather(*(client(k) for k in range(CLIENTS)))
    name = "intake"
    for kill, threshold in enumerate((300, 700, 1100), start=1):
        while len(answers) < threshold:
            assert not running.done() or running.exception() is None, running.exception()
            await asyncio.sleep(0.002)
        kill9(c, name)
        name = f"intake-{kill + 1}"
        await asyncio.sleep(0.2)
        c.start(name, "intake_svc")
        await c.wait_healthy(c.settings.intake_addr, name)
    await running

    # every report answered, stored once, and the answer is the stored record
    total = CLIENTS * PER_CLIENT
    assert len(answers) == total and retries > 0
    rows = await pg.fetch("SELECT report_id, device, received_at FROM device_reports")
    assert len(rows) == total and len({r["report_id"] for r in rows}) == total
    stored = {r["report_id"]: r for r in rows}
    for report_id, answer in answers.items():
        row = stored[report_id]
        assert (answer.report.report_id, answer.report.device_id) == (report_id, row["device"])
        assert answer.report.received_at.ToDatetime(tzinfo=UTC) == row["received_at"]
        assert answer.report.verdict == types_pb2.VERDICT_BLOCK and len(answer.report.hits) == 1
    print(
        f"{total} reports, 3 intake kills, {retries} client retries, "
        f"{sum(1 for a in answers.values() if a.deduplicated)} answered from an earlier store"
    )
