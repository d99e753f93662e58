"""Intake + scheduler + registry + worker in one test process, against real Redis and PostgreSQL:
a text goes in through Submit and its result comes back from GetTask."""

from __future__ import annotations

import grpc
import pytest

from sieve.v1 import intake_pb2, types_pb2
from tests.integration.conftest import Platform, text_spec, wait_final


async def test_a_submitted_text_is_matched_and_its_result_comes_back(platform: Platform) -> None:
    # Given a running platform
    # When a device submits a text with evasions of two lexicon words
    reply = await platform.intake.Submit(
        intake_pb2.SubmitRequest(task=text_spec("aa-bb-cc-dd-ee-01", "这里有 赌.博 和 ｃａｓｉｎｏ 的广告"))
    )
    assert reply.task.status == types_pb2.TASK_STATUS_PENDING
    assert reply.task.device_id == "AA:BB:CC:DD:EE:01"
    # Then the task succeeds and GetTask returns both hits with their original positions
    task = await wait_final(platform.intake, reply.task.task_id)
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task
    words = {h.word for h in task.result.hits}
    assert {"赌博", "casino"} <= words
    for hit in task.result.hits:
        assert "这里有 赌.博 和 ｃａｓｉｎｏ 的广告"[hit.start : hit.end] == hit.matched_text
    assert task.result.verdict != types_pb2.VERDICT_PASS
    # And the result says what the worker measured and matched against: its match time, the lexicon version
    lexicon_version = await platform.pg.fetchval("SELECT version FROM lexicon_version")
    assert task.result.lexicon_version == lexicon_version >= 1
    assert list(task.result.timings_ms) == ["match"] and task.result.timings_ms["match"] >= 0
    assert task.result.processing_time_ms == task.result.timings_ms["match"]
    assert task.result.attempt == 1 and not task.result.lines and not task.result.HasField("ocr")
    assert all(not h.HasField("line") for h in task.result.hits)
    statuses = [h.status for h in task.history]
    assert statuses == [
        types_pb2.TASK_STATUS_PENDING,
        types_pb2.TASK_STATUS_ASSIGNED,
        types_pb2.TASK_STATUS_RUNNING,
        types_pb2.TASK_STATUS_SUCCEEDED,
    ]
    assert task.attempts == 1


async def test_a_batch_over_many_devices_all_succeeds(platform: Platform) -> None:
    specs = [
        text_spec(f"02:00:00:00:00:{d:02x}", f"text {i} {'免费领取' if i % 3 == 0 else 'hello'}")
        for d in range(20)
        for i in range(10)
    ]
    reply = await platform.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
    assert all(item.code == 0 for item in reply.items)
    tasks = [await wait_final(platform.intake, item.task.task_id) for item in reply.items]
    assert all(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in tasks)
    flagged = [t for t in tasks if t.result.hits]
    assert len(flagged) == sum(1 for d in range(20) for i in range(10) if i % 3 == 0)


async def test_an_unknown_task_is_not_found(platform: Platform) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await platform.intake.GetTask(intake_pb2.GetTaskRequest(task_id="6f1c1c86-0000-4000-8000-000000000000"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
