"""The worker's task metrics of a finished batch: results counted by type and outcome (succeeded, failed, refused,
nacked), submit->start and start->done observed once per task, whatever the batch mixes."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from sieve.db.tasks import Outcome, Started
from sieve.observe.metrics import REGISTRY
from sieve.v1 import scheduler_pb2, types_pb2
from worker_svc.tracing import BatchTrace


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _assignment(task_id: uuid.UUID, task_type: int) -> scheduler_pb2.Assignment:
    a = scheduler_pb2.Assignment(task_id=str(task_id), device_id="AA:BB:CC:DD:EE:01", type=task_type, attempt=1)
    a.enqueued_at.FromDatetime(datetime.now(UTC) - timedelta(seconds=2))
    return a


def test_a_batch_counts_each_outcome_once_by_type_and_observes_each_task() -> None:
    ids = [uuid.uuid4() for _ in range(5)]
    kinds = ["TEXT", "TEXT", "TEXT", "OCR_IMAGE", "TEXT"]
    types = {"TEXT": types_pb2.TASK_TYPE_TEXT, "OCR_IMAGE": types_pb2.TASK_TYPE_OCR_IMAGE}
    assignments = [_assignment(i, types[k]) for i, k in zip(ids, kinds, strict=True)]
    before = {
        (t, o): _value("sieve_task_results_total", type=t, outcome=o)
        for t in ("TEXT", "OCR_IMAGE")
        for o in ("succeeded", "failed", "refused", "nacked")
    }
    waits = {t: _value("sieve_submit_to_start_seconds_count", type=t) for t in ("TEXT", "OCR_IMAGE")}
    runs = {t: _value("sieve_start_to_done_seconds_count", type=t) for t in ("TEXT", "OCR_IMAGE")}

    # Given a batch of which four tasks ran (a text stored, a text failed, a text refused, an image stored) and
    # the fifth was handed back
    batch = BatchTrace(assignments, "w1")
    batch.started_ns = time.time_ns()
    batch.started = [Started(i, k, 1, "x", None, None, None) for i, k in zip(ids[:4], kinds[:4], strict=True)]
    batch.outcomes = [
        Outcome(ids[0], 1, "w1", "PASS", "[]", "x"),
        Outcome(ids[1], 1, "w1", None, "[]", "", error="no text"),
        Outcome(ids[2], 1, "w1", "PASS", "[]", "x"),
        Outcome(ids[3], 1, "w1", "BLOCK", "[]", "x"),
    ]
    batch.stored_ns = time.time_ns()
    batch.stored = [True, True, False, True]
    acks = [scheduler_pb2.Ack(task_id=str(i), lease_token="1.x") for i in ids[:4]]
    nacks = [scheduler_pb2.Nack(task_id=str(ids[4]), lease_token="1.x", reason="busy")]

    # When it finishes
    batch.finish(acks, nacks)

    # Then each outcome is counted once for its type
    gained = {
        key: _value("sieve_task_results_total", type=key[0], outcome=key[1]) - value for key, value in before.items()
    }
    assert {k: v for k, v in gained.items() if v} == {
        ("TEXT", "succeeded"): 1,
        ("TEXT", "failed"): 1,
        ("TEXT", "refused"): 1,
        ("OCR_IMAGE", "succeeded"): 1,
        ("TEXT", "nacked"): 1,
    }
    # and every task that ran has its wait observed, every stored one its run time
    assert _value("sieve_submit_to_start_seconds_count", type="TEXT") - waits["TEXT"] == 3
    assert _value("sieve_submit_to_start_seconds_count", type="OCR_IMAGE") - waits["OCR_IMAGE"] == 1
    assert _value("sieve_start_to_done_seconds_count", type="TEXT") - runs["TEXT"] == 2
    assert _value("sieve_start_to_done_seconds_count", type="OCR_IMAGE") - runs["OCR_IMAGE"] == 1
