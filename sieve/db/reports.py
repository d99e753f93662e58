"""The device_reports table (migration 0013): detections devices made themselves and reported
(IntakeService.ReportDetection). A report is stored once per caller, device and report id; storing the same
report again finds the first row, and its fingerprint tells whether the request was the same."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg


@dataclass(frozen=True, slots=True)
class NewReport:
    """A validated report about to be stored."""

    caller: str
    device: str
    report_id: str
    detected_at: datetime
    subject: str  # "text", "image_url" or "image_ref"
    content: str
    verdict: str  # PASS, REVIEW or BLOCK
    hits: list[dict[str, Any]]
    labels: dict[str, str] | None
    fingerprint: bytes


@dataclass(frozen=True, slots=True)
class Stored:
    """The row a report ended up as: `created` when this call stored it, else the earlier one's;
    `same_request` false when that earlier report was another (its fingerprint differs)."""

    row: asyncpg.Record
    created: bool
    same_request: bool = True


class ReportStore:
    """Every SQL statement about device_reports."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def store(self, report: NewReport) -> Stored:
        """Stores the report unless one with its caller, device and id exists; returns the stored row (one round
        trip; two when it existed)."""
        row = await self.pool.fetchrow(
            """
            INSERT INTO device_reports (caller, device, report_id, detected_at, subject, content, verdict, hits,
                                        labels, fingerprint)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9::text::jsonb, $10)
            ON CONFLICT (caller, device, report_id) DO NOTHING
            RETURNING *
            """,
            report.caller,
            report.device,
            report.report_id,
            report.detected_at,
            report.subject,
            report.content,
            report.verdict,
            json.dumps(report.hits, ensure_ascii=False),
            None if report.labels is None else json.dumps(report.labels, ensure_ascii=False),
            report.fingerprint,
        )
        if row is not None:
            return Stored(row, True)
        earlier = await self.pool.fetchrow(
            "SELECT * FROM device_reports WHERE caller = $1 AND device = $2 AND report_id = $3",
            report.caller,
            report.device,
            report.report_id,
        )
        assert earlier is not None  # rows are never deleted but with their day (retention), long after a repeat
        return Stored(earlier, False, bytes(earlier["fingerprint"]) == report.fingerprint)
