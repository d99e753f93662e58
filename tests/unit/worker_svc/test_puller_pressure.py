"""The worker's Pull stream under pressure (worker_svc.puller): on the way into holding back it withdraws the
credits the scheduler still has (a draining message), grants none while held, and puts back — uncounted, with
the pressure's own retry delay — a batch that was already on its way (the execution-time check). Readings are
fixed through a file (SIEVE_FIXED_RESOURCES=file:...)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, types_pb2
from worker_svc.pressure import SAMPLE_EVERY_S, Pressure
from worker_svc.puller import Puller
from worker_svc.resources import ResourceSampler


async def never_runs(batch: list[scheduler_pb2.Assignment]) -> tuple[list[scheduler_pb2.Ack], list[scheduler_pb2.Nack]]:
    raise AssertionError("a batch that arrives while the worker holds back must not run")


def puller_with(readings: Path) -> tuple[Puller, asyncio.Queue[scheduler_pb2.PullRequest | None]]:
    settings = Settings(fixed_resources=f"file:{readings}", pressure_retry_s=30)
    puller = Puller(
        settings,
        "w-test",
        [types_pb2.TASK_TYPE_TEXT],
        False,
        8,
        never_runs,
        Pressure(ResourceSampler(settings), settings),
    )
    outbox: asyncio.Queue[scheduler_pb2.PullRequest | None] = asyncio.Queue()
    puller._outbox = outbox  # the stream's outgoing queue, as _stream sets it
    return puller, outbox


async def test_holding_back_withdraws_granted_credits_and_grants_none(tmp_path: Path) -> None:
    readings = tmp_path / "readings"
    readings.write_text("cpu=5,memory=20")
    puller, outbox = puller_with(readings)
    # Given a worker that granted all its 8 credits while cool
    assert puller._grant(scheduler_pb2.PullRequest()).credits == 8
    # When memory goes over the watermark
    readings.write_text("cpu=5,memory=95")
    await asyncio.sleep(SAMPLE_EVERY_S)
    # Then the next credit decision withdraws the 8 and grants nothing
    assert puller._free_credits() == 0
    assert outbox.get_nowait().draining
    assert puller.credits_granted == 0 and outbox.empty()
    # and while held, asking again sends nothing more
    assert puller._free_credits() == 0 and outbox.empty()
    # When it cools down, credits come again
    readings.write_text("cpu=5,memory=20")
    await asyncio.sleep(SAMPLE_EVERY_S)
    assert puller._free_credits() == 8


async def test_a_batch_that_arrives_while_held_back_is_put_back_uncounted_with_the_pressures_delay(
    tmp_path: Path,
) -> None:
    readings = tmp_path / "readings"
    readings.write_text("cpu=5,memory=95")
    puller, outbox = puller_with(readings)
    # When two tasks arrive while the worker is over its memory watermark
    puller._start_batch([scheduler_pb2.Assignment(task_id=t, lease_token="tok-" + t, attempt=1) for t in "ab"])
    await asyncio.gather(*puller._running)
    # Then both go back at once, uncounted, to wait about a second (the pressure has only just begun)
    sent = outbox.get_nowait()
    assert [(n.task_id, n.lease_token, n.count_attempt) for n in sent.nacks] == [
        ("a", "tok-a", False),
        ("b", "tok-b", False),
    ]
    assert all(1000 <= n.retry_after.ToMilliseconds() <= 1200 for n in sent.nacks)
    assert sent.nacks[0].reason == "worker over watermark: memory 95.0% >= 75.0%"
    assert not sent.acks and sent.credits == 0
    assert puller.in_use == 0 and puller.pressure_nacks == 2
