"""The external job state machine: what an engine does next, from what is recorded, on a first hand-out and on one
after the engine that ran it died."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from worker_svc.external.states import FAIL, FINISH, RESUME, SUBMIT, Step, label, plan

TWO = ["voice", "element"]


@dataclass
class Row:
    state: str
    attempt: int = 1


def test_a_new_job_submits_its_first_stage() -> None:
    assert plan(["job"], {}, 1) == Step(SUBMIT, 0)
    assert label(["job"], {}) == "pending"


def test_a_submitted_stage_is_resumed_not_submitted_again() -> None:
    # the engine died after the provider's job id was recorded: the next one polls that job
    assert plan(["job"], {"job": Row("submitted")}, 2) == Step(RESUME, 0)
    assert label(["job"], {"job": Row("submitted")}) == "submitted"


def test_a_submit_in_doubt_is_sent_again_under_its_recorded_key() -> None:
    # the engine died between its intent and the provider's answer: the POST goes again (same Idempotency-Key)
    assert plan(["job"], {"job": Row("submitting")}, 1) == Step(SUBMIT, 0)


def test_stages_run_in_order_and_the_job_finishes_after_the_last() -> None:
    assert plan(TWO, {"voice": Row("submitted")}, 1) == Step(RESUME, 0)
    assert label(TWO, {"voice": Row("submitted")}) == "voice_submitted"
    assert plan(TWO, {"voice": Row("succeeded")}, 1) == Step(SUBMIT, 1)
    assert label(TWO, {"voice": Row("succeeded")}) == "element_pending"
    assert plan(TWO, {"voice": Row("succeeded"), "element": Row("submitted")}, 1) == Step(RESUME, 1)
    done = {"voice": Row("succeeded"), "element": Row("succeeded")}
    assert plan(TWO, done, 1) == Step(FINISH, 2)
    assert label(TWO, done) == "element_succeeded"
    # a finish interrupted midway runs again (storing the result is idempotent)
    assert plan(TWO, {"voice": Row("completed"), "element": Row("completed")}, 1) == Step(FINISH, 2)
    assert label(TWO, {"voice": Row("completed"), "element": Row("completed")}) == "completed"


def test_a_failed_stage_hands_the_task_back_and_the_next_attempt_starts_it_again() -> None:
    failed = {"voice": Row("succeeded"), "element": Row("failed", attempt=1)}
    assert plan(TWO, failed, 1) == Step(FAIL, 1)
    assert label(TWO, failed) == "element_failed"
    assert plan(TWO, failed, 2) == Step(SUBMIT, 1)  # the stage that succeeded is not run again


def test_an_unknown_state_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown state"):
        plan(["job"], {"job": Row("downloading")}, 1)
