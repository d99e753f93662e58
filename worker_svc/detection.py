"""Running one task's detection: sensitive-word matching of a text (OCR comes in through the same
door), turned into what the result row stores."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

from sieve.db.tasks import Outcome, Started
from worker_svc.text import Matcher


def detect_text(task: Started, matcher: Matcher, worker_id: str) -> Outcome:
    """Matches the task's text against the lexicon; a task without text fails."""
    if not task.text:
        return failed(task, worker_id, "task has no text")
    began = time.perf_counter()
    result = matcher.match(task.text)
    match_ms = (time.perf_counter() - began) * 1000
    hits = [asdict(h) for h in result.hits]
    return Outcome(
        task_id=task.task_id, attempt=task.attempt, worker_id=worker_id, verdict=result.verdict.name,
        hits_json=json.dumps(hits, ensure_ascii=False), text=task.text,
        details_json=json.dumps({"timings_ms": {"match": round(match_ms, 3)}}),
    )


def failed(task: Started, worker_id: str, error: str) -> Outcome:
    return Outcome(task_id=task.task_id, attempt=task.attempt, worker_id=worker_id, verdict=None,
                   hits_json="[]", text="", error=error)


