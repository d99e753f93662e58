"""Turns a results row (sieve/db/tasks.py: verdict, hits, text, details) into a `sieve.v1.DetectionResult` with
everything the worker stored: the hits with their line positions (OCR), the OCR lines with confidence and box,
the stage timings and the processing time, the lexicon version, and how the image was read (mode, models, image,
a mode switch).

`details` is the worker's JSON (worker_svc/detection.py, worker_svc/ocr/pipeline.py). Rows written before a
field existed lack it, and a field of an unexpected shape is left out rather than failing the read: GetTask
answers with what the row holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg
from google.protobuf import timestamp_pb2

from sieve.enums import enum_value
from sieve.v1 import types_pb2

#: the timing that is the whole of an OCR task's work (worker_svc/ocr/pipeline.py)
TOTAL = "total"


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def timestamp_of(value: datetime | str | None) -> timestamp_pb2.Timestamp | None:
    """A stored time (a datetime, or ISO text as the JSON columns hold it) as a Timestamp; None stays None."""
    if value is None:
        return None
    return timestamp(datetime.fromisoformat(value) if isinstance(value, str) else value)


def _lenient_stamp(value: Any) -> timestamp_pb2.Timestamp | None:
    """`timestamp_of` for what a worker wrote into details: a value of another shape reads as None."""
    try:
        return timestamp_of(value) if isinstance(value, datetime | str) else None
    except ValueError:
        return None


def _verdict(name: str) -> types_pb2.Verdict:
    return enum_value(types_pb2.Verdict, types_pb2.Verdict.Value("VERDICT_" + name))


def _uint(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _hit(h: Mapping[str, Any]) -> types_pb2.Hit:
    hit = types_pb2.Hit(
        word=h["word"],
        category=h["category"],
        severity=h["severity"],
        start=h["start"],
        end=h["end"],
        matched_text=h["matched_text"],
        rules=[r for r in h.get("rules") or () if isinstance(r, str)],
    )
    if isinstance(h.get("line"), int):  # OCR: where it lies in the lines read
        hit.line = _uint(h["line"])
        hit.line_start = _uint(h.get("line_start"))
        hit.line_end = _uint(h.get("line_end"))
        for span in h.get("spans") or ():
            if isinstance(span, Mapping):
                hit.spans.add(line=_uint(span.get("line")), start=_uint(span.get("start")), end=_uint(span.get("end")))
    return hit


def _line(raw: Any) -> types_pb2.OcrLine | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("text"), str):
        return None
    line = types_pb2.OcrLine(text=raw["text"])
    if isinstance(raw.get("confidence"), int | float):
        line.confidence = float(raw["confidence"])
    for point in raw.get("box") or ():
        if isinstance(point, list | tuple) and len(point) == 2 and all(isinstance(c, int | float) for c in point):
            line.box.add(x=round(point[0]), y=round(point[1]))
    return line


def _timings(raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        return {}
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _ocr_run(raw: Mapping[str, Any]) -> types_pb2.OcrRun:
    run = types_pb2.OcrRun(
        engine=str(raw.get("engine", "")),
        mode=str(raw.get("mode", "")),
        device=str(raw.get("device", "")),
        simulated=raw.get("simulated") is True,
        source=str(raw.get("source", "")),
        boxes_found=_uint(raw.get("boxes_found")),
    )
    models = raw.get("models")
    if isinstance(models, Mapping):
        run.models.update({str(k): str(v) for k, v in models.items()})
    image = raw.get("image")
    if isinstance(image, Mapping):
        run.image_format = str(image.get("format", ""))
        run.image_width = _uint(image.get("width"))
        run.image_height = _uint(image.get("height"))
    switch = raw.get("mode_switch")
    if isinstance(switch, Mapping):
        run.mode_switch.CopyFrom(
            types_pb2.OcrModeSwitch(
                from_mode=str(switch.get("from", "")),
                to_mode=str(switch.get("to", "")),
                reason=str(switch.get("reason", "")),
                at=_lenient_stamp(switch.get("at")),
                rebuild_s=float(switch["rebuild_s"]) if isinstance(switch.get("rebuild_s"), int | float) else 0.0,
            )
        )
    return run


def processing_time_ms(timings: Mapping[str, float]) -> float:
    """The worker's time for the task: its total where the worker measured one (OCR), else the sum of its stages
    (a text task: its match)."""
    if TOTAL in timings:
        return timings[TOTAL]
    return sum(timings.values())


def result_message(result: asyncpg.Record | Mapping[str, Any]) -> types_pb2.DetectionResult:
    hits: list[dict[str, Any]] = result["hits"] or []
    message = types_pb2.DetectionResult(
        verdict=_verdict(result["verdict"]),
        hits=[_hit(h) for h in hits],
        text=result["text"],
        worker_id=result["worker_id"],
        created_at=timestamp_of(result["created_at"]),
        attempt=_uint(result.get("attempt")),
        lexicon_version=-1,
    )
    details = result.get("details")
    if isinstance(details, str):  # a connection without the jsonb codec (sieve/db: _init_connection)
        try:
            details = json.loads(details)
        except ValueError:
            details = None
    if not isinstance(details, Mapping):
        return message
    timings = _timings(details.get("timings_ms"))
    message.timings_ms.update(timings)
    message.processing_time_ms = processing_time_ms(timings)
    version = details.get("lexicon_version")
    if isinstance(version, int) and not isinstance(version, bool):
        message.lexicon_version = version
    ocr = details.get("ocr")
    if isinstance(ocr, Mapping):
        message.ocr.CopyFrom(_ocr_run(ocr))
        message.lines.extend(line for line in map(_line, ocr.get("lines") or ()) if line is not None)
    return message
