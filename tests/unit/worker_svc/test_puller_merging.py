"""Unit tests of how the worker folds Pull messages that queued up while the stream was busy
(worker_svc.puller.merge_into, sieve.coalesce): nothing is lost, credits add up, draining and the latest
hello win, and the close ends the folding."""

from __future__ import annotations

import asyncio

from sieve.coalesce import coalesce
from sieve.v1 import scheduler_pb2, types_pb2
from worker_svc.puller import merge_into


def test_acks_nacks_and_credits_of_later_messages_are_added_to_the_first() -> None:
    # Given two messages that queued up behind each other
    first = scheduler_pb2.PullRequest(credits=3, acks=[scheduler_pb2.Ack(task_id="a", lease_token="1")])
    later = scheduler_pb2.PullRequest(
        credits=2,
        acks=[scheduler_pb2.Ack(task_id="b", lease_token="4")],
        nacks=[scheduler_pb2.Nack(task_id="c", lease_token="2", reason="busy")],
    )

    # When the later one is folded into the first
    merge_into(first, later)

    # Then one message carries both, in order
    assert [a.task_id for a in first.acks] == ["a", "b"]
    assert [(n.task_id, n.reason) for n in first.nacks] == [("c", "busy")]
    assert first.credits == 5
    assert not first.draining and not first.HasField("hello")


def test_draining_sticks_and_the_latest_hello_wins() -> None:
    first = scheduler_pb2.PullRequest(
        hello=scheduler_pb2.WorkerHello(worker_id="w1", task_types=[types_pb2.TASK_TYPE_OCR_IMAGE], gpu=True)
    )

    merge_into(first, scheduler_pb2.PullRequest(draining=True))
    merge_into(
        first,
        scheduler_pb2.PullRequest(
            hello=scheduler_pb2.WorkerHello(worker_id="w1", task_types=[types_pb2.TASK_TYPE_OCR_IMAGE], gpu=False)
        ),
    )
    merge_into(first, scheduler_pb2.PullRequest())

    assert first.draining
    assert first.hello.worker_id == "w1" and not first.hello.gpu


def test_coalescing_folds_what_waits_in_order_and_stops_at_the_close() -> None:
    # Given two messages waiting behind the one about to be sent, then the close, then one more
    queue: asyncio.Queue[scheduler_pb2.PullRequest | None] = asyncio.Queue()
    for item in (
        scheduler_pb2.PullRequest(credits=2),
        scheduler_pb2.PullRequest(credits=3),
        None,
        scheduler_pb2.PullRequest(credits=7),
    ):
        queue.put_nowait(item)
    first = scheduler_pb2.PullRequest(credits=1)

    # When they are coalesced
    closing = coalesce(queue, first, merge_into)

    # Then the two before the close are folded in, the close is met, and what came after it is left
    assert closing and first.credits == 6
    assert queue.qsize() == 1

    # And with nothing waiting, nothing changes and the stream stays open
    assert not coalesce(asyncio.Queue(), first, merge_into) and first.credits == 6


def test_credits_granted_after_a_withdrawal_cancel_it_and_a_withdrawal_drops_credits_before_it() -> None:
    # a worker that starts holding back withdraws its credits (draining) ...
    first = scheduler_pb2.PullRequest(credits=4)
    merge_into(first, scheduler_pb2.PullRequest(draining=True))
    assert first.draining and first.credits == 0
    # ... and when it takes work again before that was sent, its new credits are what the scheduler gets
    merge_into(first, scheduler_pb2.PullRequest(credits=3, acks=[scheduler_pb2.Ack(task_id="a", lease_token="1")]))
    assert not first.draining and first.credits == 3
    assert [a.task_id for a in first.acks] == ["a"]
