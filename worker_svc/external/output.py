"""What an external job's output becomes: the task's result row.

A moderation provider's output is a JSON object with `verdict` (PASS, REVIEW or BLOCK, any case) and `hits` (a
list of objects; each becomes a hit with `word`, `category`, `severity`, `start`, `end`, `matched_text`, missing
fields empty); it is the task's result. Any other provider's output ("kind": "artifact") is kept as the result's
artifact (`details.external.artifact`: the JSON value, or the text), with verdict PASS and no hits. Either way the
result's details name the provider, each stage's provider job id and polls, and the cost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sieve.db.external_jobs import JobRow
from sieve.db.tasks import Outcome, Started
from sieve.external_config import ProviderConfig

VERDICTS = ("PASS", "REVIEW", "BLOCK")
#: largest artifact kept in the result (characters of its JSON)
MAX_ARTIFACT_CHARS = 1_000_000


def _hit(raw: Any) -> dict[str, Any]:
    h = raw if isinstance(raw, dict) else {"word": str(raw)}

    def text(key: str) -> str:
        return str(h.get(key, ""))[:256]

    def number(key: str) -> int:
        value = h.get(key, 0)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return {
        "word": text("word"),
        "category": text("category"),
        "severity": number("severity"),
        "start": number("start"),
        "end": number("end"),
        "matched_text": text("matched_text"),
    }


def outcome_of(
    started: Started, worker_id: str, provider: ProviderConfig, rows: Sequence[JobRow], output: bytes, seconds: float
) -> Outcome | str:
    """The Outcome to store, or why the output cannot be a result (a str: the job fails)."""
    details: dict[str, Any] = {
        "timings_ms": {"external": round(seconds * 1000, 3)},
        "external": {
            "provider": provider.name,
            "stages": [{"stage": r.stage, "job_id": r.provider_job_id, "polls": r.polls} for r in rows],
            "cost": sum(r.cost for r in rows),
        },
    }
    if provider.kind == "moderation":
        try:
            data = json.loads(output)
        except ValueError:
            return f"{provider.name}: the output is not JSON"
        verdict = str(data.get("verdict", "")).upper() if isinstance(data, dict) else ""
        if verdict not in VERDICTS:
            return f"{provider.name}: the output has no verdict of {', '.join(VERDICTS)}"
        hits = data.get("hits") if isinstance(data.get("hits"), list) else []
        return Outcome(
            task_id=started.task_id,
            attempt=started.attempt,
            worker_id=worker_id,
            verdict=verdict,
            hits_json=json.dumps([_hit(h) for h in hits[:1000]], ensure_ascii=False),
            text="",
            details_json=json.dumps(details, ensure_ascii=False),
        )
    try:
        artifact: Any = json.loads(output)
    except ValueError:
        artifact = output.decode("utf-8", errors="replace")
    shown = json.dumps(artifact, ensure_ascii=False)
    if len(shown) > MAX_ARTIFACT_CHARS:
        return f"{provider.name}: the output is larger than {MAX_ARTIFACT_CHARS} characters"
    details["external"]["artifact"] = artifact
    return Outcome(
        task_id=started.task_id,
        attempt=started.attempt,
        worker_id=worker_id,
        verdict="PASS",
        hits_json="[]",
        text="",
        details_json=json.dumps(details, ensure_ascii=False).replace("\\u0000", ""),
    )
