"""ReportDetection against real intake servers with credentials and the real PostgreSQL: a device's own detection
is stored before the answer and answered with the stored record; the same report again answers that record; the
same id with another report is ALREADY_EXISTS; bad input is refused naming the field and stores nothing; another
caller's device is PERMISSION_DENIED."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from google.protobuf import timestamp_pb2
from redis.asyncio import Redis

from sieve import rpc
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.security.test_tenants import Intake, as_, error_info, intake

DEVICE = "AA:BB:CC:20:00:01"
DETECTED = datetime.now(UTC) - timedelta(seconds=30)
TEXT = "这里有 赌博 广告"


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(moment)
    return ts


def report(**changes: object) -> intake_pb2.ReportDetectionRequest:
    request = intake_pb2.ReportDetectionRequest(
        device_id="aa-bb-cc-20-00-01",
        report_id="r-1",
        detected_at=stamp(DETECTED),
        text=TEXT,
        verdict=types_pb2.VERDICT_BLOCK,
        hits=[types_pb2.Hit(word="赌博", category="gambling", severity=3, start=4, end=6, matched_text="赌博")],
        labels={"student_id": "s-9"},
    )
    for name, value in changes.items():
        if name == "clear":
            request.ClearField(str(value))
        elif name == "hits":
            del request.hits[:]
            request.hits.extend(value)  # type: ignore[arg-type]
        elif name == "detected_at":
            request.detected_at.CopyFrom(value)  # type: ignore[arg-type]
        elif name == "labels":
            request.labels.clear()
            request.labels.update(value)  # type: ignore[arg-type]
        else:
            setattr(request, name, value)
    return request


async def send(i: Intake, who: str, request: intake_pb2.ReportDetectionRequest) -> intake_pb2.ReportDetectionResponse:
    return await i.stub.ReportDetection(request, metadata=as_(who))


async def refusal(i: Intake, who: str, request: intake_pb2.ReportDetectionRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await send(i, who, request)
    return err.value


async def test_a_report_is_stored_and_answered_with_the_stored_record(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as i:
        sent = report()
        reply = await send(i, "alice", sent)
        stored = reply.report
        assert not reply.deduplicated
        assert (stored.report_id, stored.device_id, stored.caller, stored.text) == ("r-1", DEVICE, "alice", TEXT)
        assert stored.verdict == types_pb2.VERDICT_BLOCK and list(stored.hits) == list(sent.hits)
        assert dict(stored.labels) == {"student_id": "s-9"} and stored.detected_at == sent.detected_at
        row = await pg.fetchrow("SELECT * FROM device_reports WHERE report_id = 'r-1'")
        assert (row["caller"], row["device"], row["subject"], row["verdict"]) == ("alice", DEVICE, "text", "BLOCK")
        assert stored.received_at.ToDatetime(tzinfo=UTC) == row["received_at"]
        # an image report, by reference or by URL, with its hits' words (no offsets to check)
        for kind, value in (("image_ref", "cam-3/2026-12-01/0001.jpg"), ("image_url", "https://img.example.com/a.png")):
            image = report(report_id=f"r-{kind}", **{kind: value})
            got = (await send(i, "alice", image)).report
            assert got.WhichOneof("subject") == kind and getattr(got, kind) == value
        # a PASS has no hits
        passed = await send(i, "alice", report(report_id="r-pass", verdict=types_pb2.VERDICT_PASS, hits=[]))
        assert passed.report.verdict == types_pb2.VERDICT_PASS and not passed.report.hits
        assert await pg.fetchval("SELECT count(*) FROM device_reports") == 4


async def test_the_same_report_again_answers_the_first_and_another_under_its_id_is_refused(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg) as i:
        first = await send(i, "alice", report())
        again = await send(i, "alice", report())
        assert again.deduplicated and again.report == first.report
        # another report under the same id: ALREADY_EXISTS naming the id, nothing changes
        for other in (
            report(verdict=types_pb2.VERDICT_REVIEW),
            report(text=TEXT + "!"),
            report(labels={}),
            report(detected_at=stamp(datetime.now(UTC) - timedelta(hours=1))),
        ):
            err = await refusal(i, "alice", other)
            assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err.details()
            info = error_info(err)
            assert info is not None and info.reason == "REPORT_ID_REUSED" and info.metadata["report_id"] == "r-1"
        assert await pg.fetchval("SELECT count(*) FROM device_reports") == 1
        # the id is the device's own: another device may use it
        other_device = await send(i, "alice", report(device_id="AA:BB:CC:20:00:02"))
        assert not other_device.deduplicated


async def test_another_callers_device_is_permission_denied(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with intake(settings, redis, pg) as i:
        await send(i, "alice", report())
        err = await refusal(i, "bob", report(report_id="r-2"))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert await pg.fetchval("SELECT count(*) FROM device_reports WHERE caller = 'bob'") == 0


NOW = datetime.now(UTC)
BLOCK_HIT = types_pb2.Hit(word="赌博", category="gambling", severity=3, start=4, end=6, matched_text="赌博")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"device_id": "not-a-mac"}, "device_id"),
        ({"device_id": "A" * 1000}, "device_id"),
        ({"report_id": ""}, "report_id"),
        ({"report_id": "x" * 201}, "report_id"),
        ({"report_id": "a\nb"}, "report_id"),
        ({"clear": "detected_at"}, "detected_at"),
        ({"detected_at": stamp(NOW + timedelta(hours=1))}, "detected_at"),
        ({"detected_at": stamp(datetime(1999, 1, 1, tzinfo=UTC))}, "detected_at"),
        ({"clear": "text"}, "text"),
        ({"text": "   "}, "text"),
        ({"text": "a\x00b"}, "text"),
        ({"image_url": "ftp://x/y.png"}, "image_url"),
        ({"image_ref": "a\x07b"}, "image_ref"),
        ({"verdict": types_pb2.VERDICT_UNSPECIFIED}, "verdict"),
        ({"verdict": 9}, "verdict"),
        ({"verdict": types_pb2.VERDICT_PASS}, "hits"),
        ({"hits": []}, "hits"),
        (
            {"hits": [types_pb2.Hit(word="", category="c", severity=3, start=0, end=1, matched_text="这")]},
            "hits[0].word",
        ),
        (
            {"hits": [types_pb2.Hit(word="w", category="c", severity=9, start=0, end=1, matched_text="这")]},
            "hits[0].severity",
        ),
        (
            {"hits": [BLOCK_HIT, types_pb2.Hit(word="w", category="c", severity=2, start=3, end=99, matched_text="x")]},
            "hits[1].end",
        ),
        (
            {"hits": [types_pb2.Hit(word="w", category="c", severity=2, start=0, end=2, matched_text="no")]},
            "hits[0].matched_text",
        ),
        ({"hits": [BLOCK_HIT] * 101}, "hits"),
        ({"labels": {"bad key": "v"}}, "labels"),
    ],
)
async def test_bad_reports_are_refused_naming_the_field_and_store_nothing(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, changes: dict[str, object], field: str
) -> None:
    async with intake(settings, redis, pg) as i:
        err = await refusal(i, "alice", report(**changes))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc.bad_fields_of(err) == [field], err.details()
        assert await pg.fetchval("SELECT count(*) FROM device_reports") == 0
