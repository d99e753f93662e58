"""ReportDetection for the intake: a device's own detection checked (`validate_report`: every field, naming the bad
one), turned into what `sieve.db.reports` stores, and the stored row as a `DetectionReport`.

A report is consistent or refused: exactly one subject; a PASS has no hits, a REVIEW or BLOCK at least one; with a
text, each hit's offsets lie in it and its matched_text is the text between them. The same report again (caller,
device, report_id and a SHA-256 fingerprint of what was reported) answers the stored one; another report under the
same id is ALREADY_EXISTS (`ReportConflict`), and nothing changes.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from google.rpc import code_pb2, error_details_pb2, status_pb2

from intake_svc.result_view import timestamp
from intake_svc.validation import MAX_URL, checked_labels, parse_device, parse_time
from sieve.db.reports import NewReport
from sieve.enums import enum_name, enum_value
from sieve.errors import InvalidInput
from sieve.fields import shown, text_problem
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2

MAX_REPORT_ID = 200
MAX_IMAGE_REF = 512
MAX_HITS = 100
MAX_WORD = 100
MAX_CATEGORY = 64
#: how far ahead of the intake's clock a device's clock may be
CLOCK_SKEW = timedelta(minutes=5)
#: the earliest detection time accepted
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
DOMAIN = "sieve.v1.IntakeService"


class ReportConflict(Exception):
    """The report id names an earlier report of another content: nothing was changed."""

    def __init__(self, report_id: str) -> None:
        super().__init__(report_id)
        self.report_id = report_id

    def status(self) -> status_pb2.Status:
        message = (
            f"report_id {shown(self.report_id)} was used for another report of this device: nothing was changed; "
            "send the same report to get it, or use a new id"
        )
        status = status_pb2.Status(code=code_pb2.ALREADY_EXISTS, message=message)
        status.details.add().Pack(
            error_details_pb2.ErrorInfo(
                reason="REPORT_ID_REUSED", domain=DOMAIN, metadata={"field": "report_id", "report_id": self.report_id}
            )
        )
        return status


def validate_report(
    request: intake_pb2.ReportDetectionRequest, caller: str, settings: Settings, now: datetime | None = None
) -> NewReport:
    """The request as it is stored, or InvalidInput naming the field."""
    now = now or datetime.now(UTC)
    device = parse_device(request.device_id)
    if not request.report_id:
        raise InvalidInput("report_id", "is empty")
    problem = text_problem(request.report_id, max_chars=MAX_REPORT_ID, printable=True)
    if problem is not None:
        raise InvalidInput("report_id", problem)
    detected_at = _detected_at(request, now)
    subject, content = _subject(request, settings)
    verdict = _verdict(request)
    hits = [_hit(h, f"hits[{i}]", content if subject == "text" else None) for i, h in enumerate(request.hits)]
    if len(hits) > MAX_HITS:
        raise InvalidInput("hits", f"has {len(hits)} hits: at most {MAX_HITS}")
    if (verdict == "PASS") != (not hits):
        raise InvalidInput("hits", "a PASS has no hits; a REVIEW or BLOCK has at least one")
    labels = checked_labels(request.labels, "labels")
    fingerprint = hashlib.sha256(
        json.dumps(
            [detected_at.isoformat(), subject, content, verdict, hits, sorted((labels or {}).items())],
            ensure_ascii=False,
        ).encode()
    ).digest()
    return NewReport(
        caller, device, request.report_id, detected_at, subject, content, verdict, hits, labels, fingerprint
    )


def _detected_at(request: intake_pb2.ReportDetectionRequest, now: datetime) -> datetime:
    if not request.HasField("detected_at"):
        raise InvalidInput("detected_at", "is required")
    moment = parse_time(request.detected_at, "detected_at")
    if moment < EARLIEST:
        raise InvalidInput("detected_at", f"is before {EARLIEST:%Y-%m-%d}")
    if moment > now + CLOCK_SKEW:
        raise InvalidInput("detected_at", "is in the future (more than 5 minutes ahead of the intake's clock)")
    return moment


def _subject(request: intake_pb2.ReportDetectionRequest, settings: Settings) -> tuple[str, str]:
    kind = request.WhichOneof("subject")
    if kind is None:
        raise InvalidInput("text", "a report names what was checked: a text, an image_url or an image_ref")
    value: str = getattr(request, kind)
    if kind == "text":
        if not value.strip():
            raise InvalidInput("text", "is empty")
        problem = text_problem(value, max_bytes=settings.max_text_bytes)
    elif kind == "image_url":
        problem = text_problem(value, max_chars=MAX_URL, printable=True)
        if problem is None and not value.lower().startswith(("http://", "https://")):
            problem = "must be an http(s) URL"
    else:
        problem = text_problem(value, max_chars=MAX_IMAGE_REF, printable=True)
        if problem is None and not value.strip():
            problem = "is empty"
    if problem is not None:
        raise InvalidInput(kind, problem)
    return kind, value


def _verdict(request: intake_pb2.ReportDetectionRequest) -> str:
    if request.verdict == types_pb2.VERDICT_UNSPECIFIED or request.verdict not in types_pb2.Verdict.values():
        raise InvalidInput("verdict", f"must be PASS, REVIEW or BLOCK (got {request.verdict})")
    return enum_name(types_pb2.Verdict, request.verdict)


def _hit(hit: types_pb2.Hit, field: str, text: str | None) -> dict[str, Any]:
    for name, value, limit in (("word", hit.word, MAX_WORD), ("category", hit.category, MAX_CATEGORY)):
        problem = text_problem(value, max_chars=limit, printable=True) or (None if value.strip() else "is empty")
        if problem is not None:
            raise InvalidInput(f"{field}.{name}", problem)
    if not 1 <= hit.severity <= 5:
        raise InvalidInput(f"{field}.severity", "must be 1 to 5")
    if hit.end < hit.start:
        raise InvalidInput(f"{field}.end", "must not be before start")
    if text is not None:
        if hit.end > len(text):
            raise InvalidInput(f"{field}.end", f"is past the end of the text ({len(text)} characters)")
        if hit.matched_text != text[hit.start : hit.end]:
            raise InvalidInput(f"{field}.matched_text", "is not the text between start and end")
    else:
        problem = text_problem(hit.matched_text, max_chars=MAX_WORD * 4, printable=True)
        if problem is not None:
            raise InvalidInput(f"{field}.matched_text", problem)
    return {
        "word": hit.word,
        "category": hit.category,
        "severity": hit.severity,
        "start": hit.start,
        "end": hit.end,
        "matched_text": hit.matched_text,
    }


def report_message(row: asyncpg.Record) -> intake_pb2.DetectionReport:
    """A stored report as the API shows it."""
    report = intake_pb2.DetectionReport(
        report_id=row["report_id"],
        device_id=row["device"],
        caller=row["caller"],
        detected_at=timestamp(row["detected_at"]),
        received_at=timestamp(row["received_at"]),
        verdict=enum_value(types_pb2.Verdict, types_pb2.Verdict.Value("VERDICT_" + row["verdict"])),
        hits=[types_pb2.Hit(**h) for h in _json(row["hits"]) or []],
        labels=_json(row["labels"]) or {},
    )
    setattr(report, row["subject"], row["content"])
    return report


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
