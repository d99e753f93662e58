"""The one state machine of every external job (design 004), as pure functions of what is recorded.

A job is its provider's stages in order; each stage moves `pending -> submitted -> succeeded`, or to `failed`, and
the job is `completed` once its output is stored. A one-stage job reads `pending -> submitted -> succeeded ->
completed`; a two-stage one `voice_pending -> voice_submitted -> voice_succeeded -> element_pending -> ... ->
completed`, the slot of one stage released before the next stage's is taken.

What is recorded (sieve/db/external_jobs.py) is per stage: no row (pending), "submitting" (the POST may or may not
have reached the provider: send it again under the same Idempotency-Key), "submitted" (poll the provider's job),
"succeeded", "failed", "completed". `plan` says what an engine holding the task's hand-out does next — the same
answer whether this is the first hand-out or one after the engine that ran it died.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sieve.db.external_jobs import COMPLETED, FAILED, SUBMITTED, SUBMITTING, SUCCEEDED

#: what to do with a stage
SUBMIT = "submit"  # take a slot and POST (again, under the recorded key, for a "submitting" row)
RESUME = "resume"  # take the slot back (same holder) and poll the provider job recorded
FINISH = "finish"  # every stage succeeded: download the output and store it (again, idempotently)
FAIL = "fail"  # a stage failed for this very attempt: hand the task back, counted


class Recorded(Protocol):
    """What `plan` reads of a stage's row."""

    @property
    def state(self) -> str: ...

    @property
    def attempt(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Step:
    """The next thing to do: `action` on stage `index` (FINISH: every stage is done, index = len(stages))."""

    action: str
    index: int


def plan(stages: Sequence[str], rows: Mapping[str, Recorded], attempt: int) -> Step:
    """The next step of a job with these `stages`, recorded `rows` (stage -> row) and hand-out `attempt`."""
    for index, stage in enumerate(stages):
        row = rows.get(stage)
        if row is None or row.state == SUBMITTING:
            return Step(SUBMIT, index)
        if row.state == SUBMITTED:
            return Step(RESUME, index)
        if row.state == FAILED:
            # a later attempt starts the stage again; the attempt that saw it fail hands the task back
            return Step(SUBMIT if row.attempt < attempt else FAIL, index)
        if row.state not in (SUCCEEDED, COMPLETED):
            raise ValueError(f"stage {stage!r} has an unknown state {row.state!r}")
    return Step(FINISH, len(stages))


def label(stages: Sequence[str], rows: Mapping[str, Recorded]) -> str:
    """The job's state as one name: "completed", or "<stage>_<pending|submitted|succeeded|failed>" ("pending",
    "submitted" ... for a one-stage job), the stage the job is at."""
    named = len(stages) > 1
    for stage in stages:
        row = rows.get(stage)
        state = "pending" if row is None else "submitted" if row.state in (SUBMITTING, SUBMITTED) else row.state
        if state == COMPLETED:
            continue
        if state == SUCCEEDED and stage != stages[-1]:
            continue
        return f"{stage}_{state}" if named else state
    return COMPLETED
