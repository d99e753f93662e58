"""WatchTask under kill -9: a client watches all of its tasks while 1 000 of them run through real service
processes; the intake serving the stream is killed twice mid-stream and started again, and each time the client
resumes on the new intake from the cursor of the last change it handled. In the end it has seen every status
change of every task exactly once, in the order each task's history has it."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import grpc
import pytest

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.faults.harness import FAST_ENV, kill9
from tests.support.cluster import Cluster
from tests.support.tasks import text_spec

pytestmark = pytest.mark.timeout(240)

TASKS = 1000
FINAL = {
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_EXPIRED,
    types_pb2.TASK_STATUS_CANCELLED,
    types_pb2.TASK_STATUS_DEAD_LETTERED,
}


def status_changes(task: types_pb2.Task) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    previous = None
    for n, change in enumerate(task.history, start=1):
        if change.status != previous:
            out.append((n, change.status))
        previous = change.status
    return out


async def test_a_watcher_resumed_after_intake_kills_sees_every_change_once_in_order(fault_cluster: Cluster) -> None:
    c = fault_cluster
    c.env.update(FAST_ENV)
    await c.start_all(workers=1)
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    cursor = ""
    resumes = 0
    last_response = [time.monotonic()]

    async def watch(until: int) -> None:
        """Reads changes (from `cursor`) until `until` have been seen in all, or every task is final."""
        nonlocal cursor
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            stream = intake_pb2_grpc.IntakeServiceStub(channel).WatchTask(intake_pb2.WatchTaskRequest(cursor=cursor))
            async for response in stream:
                last_response[0] = time.monotonic()
                for change in response.changes:
                    seen[change.task_id].append((change.sequence, change.status))
                    cursor = change.cursor
                if sum(map(len, seen.values())) >= until or (
                    len(seen) == TASKS and all(v[-1][1] in FINAL for v in seen.values())
                ):
                    stream.cancel()
                    return

    async def watch_resuming(until: int) -> None:
        nonlocal resumes
        deadline = time.monotonic() + 90
        while True:
            try:
                await watch(until)
                return
            except grpc.aio.AioRpcError as exc:
                assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), exc
                assert time.monotonic() < deadline, "the intake stayed unavailable"
                resumes += 1
                await asyncio.sleep(0.2)

    # a cursor from before anything is submitted: the first change of the first task
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        first = (await stub.Submit(intake_pb2.SubmitRequest(task=text_spec("AA:BB:CC:50:00:FF", "first")))).task
        stream = stub.WatchTask(intake_pb2.WatchTaskRequest(task_ids=[first.task_id], initial_state=True))
        cursor = (await stream.read()).changes[0].cursor
        stream.cancel()
        specs = [text_spec(f"AA:BB:CC:50:00:{n % 20:02X}", f"watched {n}") for n in range(TASKS - 1)]
        for start in range(0, len(specs), 333):
            reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[start : start + 333]))
            assert all(item.code == 0 for item in reply.items)

    # one watcher, resuming on its own, runs while the intake is killed twice, each time after more changes came
    watcher = asyncio.create_task(watch_resuming(until=10**9))
    name = "intake"
    for kill, after in enumerate((800, 2000), start=1):
        while sum(map(len, seen.values())) < after:
            assert not watcher.done(), watcher
            await asyncio.sleep(0.005)
        kill9(c, name)
        await asyncio.sleep(0.3)
        name = f"intake-{kill + 1}"
        c.start(name, "intake_svc")
        await c.wait_healthy(c.settings.intake_addr, name)
    try:
        await asyncio.wait_for(watcher, 120)
    except TimeoutError:
        quiet = time.monotonic() - last_response[0]
        raise AssertionError(await stalled_watch_report(c, seen, resumes, quiet)) from None
    assert resumes >= 2

    await check_every_change_seen_once(c, first.task_id, seen)
    print(f"{TASKS} tasks, {sum(map(len, seen.values()))} changes watched, intake killed twice, {resumes} resumes")


async def check_every_change_seen_once(c: Cluster, first: str, seen: dict[str, list[tuple[int, int]]]) -> None:
    """Every task is final and was watched changing exactly as its stored history has it."""
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        ids = [first, *seen.keys() - {first}]
        assert len(seen) == TASKS
        for task_id in ids:
            task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
            assert task.status in FINAL
            expected = status_changes(task)
            # the first task's PENDING came as its initial state, before the cursor
            got = seen[task_id] if task_id != first else [expected[0], *seen[task_id]]
            assert got == expected, task_id


async def stalled_watch_report(c: Cluster, seen: dict[str, list[tuple[int, int]]], resumes: int, quiet: float) -> str:
    """Why the watcher never saw every task final: the tasks it has not seen end, against their stored history."""
    changes = sum(map(len, seen.values()))
    lines = [
        f"the watcher did not finish: {len(seen)} tasks, {changes} changes, {resumes} resumes, "
        f"the last response {quiet:.1f} s ago; exited: {sorted(n for n, p in c.procs.items() if p.poll() is not None)}"
    ]
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        listed = await stub.ListTasks(intake_pb2.ListTasksRequest(page_size=TASKS))
        for task in listed.tasks:
            got = seen.get(task.task_id, [])
            if not got or got[-1][1] not in FINAL:
                full = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task.task_id))).task
                lines.append(f"{task.task_id}: stored {status_changes(full)}, watched {got}")
                if len(lines) > 20:
                    break
    return "\n".join(lines)
