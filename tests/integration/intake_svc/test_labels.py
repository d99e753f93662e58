"""Labels (TaskSpec.labels): a caller's metadata goes in with a task, is stored with it and comes back from Submit,
SubmitBatch and GetTask; labels over the bounds are refused naming the field and change nothing; they are part of
what an idempotency key compares."""

from __future__ import annotations

import grpc
import pytest

from intake_svc.idempotency import fingerprint
from intake_svc.validation import MAX_LABEL_VALUE, MAX_LABELS
from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import Platform, text_spec
from tests.integration.intake_svc.test_input_rules import _already_exists
from tests.integration.intake_svc.test_refusals import assert_nothing_recorded, refused_field

DEVICE = "AA-BB-CC-DD-EE-21"


def labelled(labels: dict[str, str], text: str = "hello", **kw: object) -> intake_pb2.TaskSpec:
    spec = text_spec(DEVICE, text, **kw)
    spec.labels.update(labels)
    return spec


async def test_labels_are_stored_and_come_back_from_submit_batch_and_get_task(
    platform_without_workers: Platform,
) -> None:
    p = platform_without_workers
    labels = {"student_id": "s-1024", "assignment_id": "hw/7", "note": "第一次 作业 ✓"}
    # When a task is submitted with labels
    reply = await p.intake.Submit(intake_pb2.SubmitRequest(task=labelled(labels)))
    # Then Submit, GetTask and the stored row all hold them
    assert dict(reply.task.labels) == labels
    task = (await p.intake.GetTask(intake_pb2.GetTaskRequest(task_id=reply.task.task_id))).task
    assert dict(task.labels) == labels
    assert await p.pg.fetchval("SELECT labels FROM tasks WHERE id = $1::uuid", reply.task.task_id) == labels
    # And in a batch each item keeps its own; a task without labels stores none
    batch = await p.intake.SubmitBatch(
        intake_pb2.SubmitBatchRequest(tasks=[labelled({"n": "1"}, "a"), text_spec(DEVICE, "b"), labelled({"n": "3"})])
    )
    assert [dict(item.task.labels) for item in batch.items] == [{"n": "1"}, {}, {"n": "3"}]
    unlabelled = batch.items[1].task.task_id
    assert await p.pg.fetchval("SELECT labels IS NULL FROM tasks WHERE id = $1::uuid", unlabelled)
    got = (await p.intake.GetTask(intake_pb2.GetTaskRequest(task_id=unlabelled))).task
    assert dict(got.labels) == {}


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({f"k{i}": "v" for i in range(MAX_LABELS + 1)}, "task.labels"),
        ({"": "v"}, "task.labels"),
        ({"班级": "v"}, "task.labels"),
        ({"has space": "v"}, "task.labels"),
        ({"-leading": "v"}, "task.labels"),
        ({"k" * 64: "v"}, "task.labels"),
        ({"k": "v" * (MAX_LABEL_VALUE + 1)}, "task.labels[k]"),
        ({"k": "line\nbreak"}, "task.labels[k]"),
        ({"k": "nul\x00"}, "task.labels[k]"),
    ],
    ids=[
        "too-many",
        "empty-key",
        "non-ascii-key",
        "space-in-key",
        "leading-dash",
        "long-key",
        "long-value",
        "newline",
        "nul",
    ],
)
async def test_labels_over_the_bounds_are_refused_naming_the_field(
    platform_without_workers: Platform, labels: dict[str, str], field: str
) -> None:
    code, fields = await refused_field(platform_without_workers, labelled(labels))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, [field])
    await assert_nothing_recorded(platform_without_workers)


async def test_the_most_labels_of_the_longest_form_are_accepted(platform_without_workers: Platform) -> None:
    labels = {f"{i:02d}" + "k" * 61: "v" * MAX_LABEL_VALUE for i in range(MAX_LABELS)}
    reply = await platform_without_workers.intake.Submit(intake_pb2.SubmitRequest(task=labelled(labels)))
    assert dict(reply.task.labels) == labels


async def test_an_idempotency_key_compares_the_labels(platform_without_workers: Platform) -> None:
    p = platform_without_workers
    first = await p.intake.Submit(intake_pb2.SubmitRequest(task=labelled({"a": "1", "b": "2"}, idempotency_key="k")))
    # the same labels (in any order on the wire) are the same request
    again = await p.intake.Submit(intake_pb2.SubmitRequest(task=labelled({"b": "2", "a": "1"}, idempotency_key="k")))
    assert (again.task.task_id, again.deduplicated) == (first.task.task_id, True)
    # other labels, or none, are another request: ALREADY_EXISTS naming the first task, nothing changed
    for other in ({"a": "1", "b": "3"}, {"a": "1"}, {}):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await p.intake.Submit(intake_pb2.SubmitRequest(task=labelled(other, idempotency_key="k")))
        assert _already_exists(err.value).metadata["task_id"] == first.task.task_id
    assert await p.pg.fetchval("SELECT count(*) FROM tasks") == 1
    # a keyed task without labels fingerprints as before labels existed
    plain = await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec(DEVICE, "x", idempotency_key="plain")))
    stored = await p.pg.fetchval("SELECT fingerprint FROM tasks WHERE id = $1::uuid", plain.task.task_id)
    assert stored == fingerprint(types_pb2.TASK_TYPE_TEXT, types_pb2.PRIORITY_NORMAL, 0, "text", b"x", 0)
