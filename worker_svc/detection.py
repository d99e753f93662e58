"""Running one task's detection: sensitive-word matching of a text (OCR comes in through the same
door), turned into what the result row stores — or into a `Retry` when the failure may pass.

Failures are classified once, here and in the OCR pipeline (`worker_svc.ocr.pipeline`):

- permanent, the task FAILS at once with the reason: no text, a text the lexicon cannot process, an image that
  cannot be decoded, an image URL answering HTTP 4xx (other than 408 / 429), a refused or malformed URL;
- transient, the task is nacked and its attempt counted, and the scheduler retries it after the retry backoff
  (dead-lettered at its max attempts): fetch timeouts and connection errors, HTTP 5xx / 408 / 429, an OCR runtime
  error, a PostgreSQL write that failed (`worker_svc.runner`);
- past the execution timeout (`SIEVE_TEXT_TIMEOUT_S`, `SIEVE_OCR_TIMEOUT_S`): nacked, counted;
- not the task's fault (the OCR engine is held by abandoned work): nacked uncounted, retried a little later.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sieve.db.tasks import Outcome, Started
from worker_svc.text import Hit, Matcher

#: why a task is handed back (the `reason` label of sieve_task_nacks)
TRANSIENT = "transient"
TIMEOUT = "timeout"
ENGINE_BUSY = "engine_busy"


@dataclass(frozen=True, slots=True)
class Retry:
    """A task to hand back (nack) rather than finish: why, whether the attempt counts, and when to try again
    (None: the scheduler's retry backoff)."""

    task_id: str
    reason: str
    kind: str = TRANSIENT
    counted: bool = True
    retry_after_s: float | None = None


def detect_text(task: Started, matcher: Matcher, worker_id: str) -> Outcome:
    """Matches the task's text against the lexicon; a task without text, or a text the matcher cannot process,
    fails."""
    if not task.text:
        return failed(task, worker_id, "task has no text")
    began = time.perf_counter()
    try:
        result = matcher.match(task.text)
    except Exception as exc:  # the input, not the moment: trying again gives the same
        return failed(task, worker_id, f"text could not be matched: {type(exc).__name__}: {exc}"[:500])
    match_ms = (time.perf_counter() - began) * 1000
    return Outcome(
        task_id=task.task_id,
        attempt=task.attempt,
        worker_id=worker_id,
        verdict=result.verdict.name,
        hits_json=hits_json(result.hits),
        text=task.text,
        # what json.dumps({"timings_ms": {"match": ms}, "lexicon_version": v}) writes, without its cost (a float's
        # repr is JSON's)
        details_json=(
            f'{{"timings_ms": {{"match": {round(match_ms, 3)!r}}}, "lexicon_version": {int(matcher.version)}}}'
        ),
        unmarked=task.unmarked,
    )


def hits_json(hits: Sequence[Hit]) -> str:
    """The hits as the result row stores them: a JSON list of their fields (dataclasses.asdict's dicts, built
    directly: asdict copies recursively and cost more than the match itself)."""
    if not hits:
        return "[]"
    return json.dumps(
        [
            {
                "word": h.word,
                "category": h.category,
                "severity": h.severity,
                "start": h.start,
                "end": h.end,
                "matched_text": h.matched_text,
                "rules": h.rules,
            }
            for h in hits
        ],
        ensure_ascii=False,
    )


def failed(task: Started, worker_id: str, error: str) -> Outcome:
    return Outcome(
        task_id=task.task_id,
        attempt=task.attempt,
        worker_id=worker_id,
        verdict=None,
        hits_json="[]",
        text="",
        error=error,
        unmarked=task.unmarked,
    )
