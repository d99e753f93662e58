"""The worker time an ack reports (fair by cost charges the task's device for it): the work stages of the result's
timings, not the waits."""

from __future__ import annotations

import json
import uuid

from sieve.db.tasks import Outcome
from worker_svc.runner import worker_time_ms


def outcome(details: object) -> Outcome:
    return Outcome(uuid.uuid4(), 1, "w", "PASS", "[]", "", details_json=json.dumps(details))


def test_an_ocr_result_counts_its_work_stages_only() -> None:
    # Given a task that waited 900 ms for the engine behind a dear one, then worked 120 ms
    timings = {"fetch": 50, "decode": 10, "queue": 900, "detect": 60, "recognise": 40, "match": 10, "total": 1070}
    # Then its worker time is the 120 ms of work: not the wait, the download or the total again
    assert worker_time_ms(outcome({"timings_ms": timings})) == 120


def test_a_text_result_counts_its_match_and_nothing_else_says_nothing() -> None:
    assert worker_time_ms(outcome({"timings_ms": {"match": 2.6}})) == 3
    assert worker_time_ms(outcome({})) == 0
    assert worker_time_ms(outcome({"timings_ms": {"detect": "x"}})) == 0
    assert worker_time_ms(Outcome(uuid.uuid4(), 1, "w", "PASS", "[]", "", details_json="not json")) == 0
