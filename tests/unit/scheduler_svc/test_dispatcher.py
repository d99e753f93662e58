"""The dispatch loop against the in-memory fake of the Redis store (no Redis): which device is served, how many
of its tasks go to which worker for which credits, and what becomes of the tasks no worker can take."""

from __future__ import annotations

import asyncio

from scheduler_svc.board import Board
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.routing import Router
from scheduler_svc.sessions import Session
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, types_pb2
from tests.unit.scheduler_svc.fake_store import FakeOutcomes, FakeStore, entry

TEXT, OCR = types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE
HIGH = types_pb2.PRIORITY_HIGH
A, B = "AA:00:00:00:00:0A", "AA:00:00:00:00:0B"


class Replica:
    """One scheduler replica's dispatch side on the fake store."""

    def __init__(self, **settings: object) -> None:
        self.settings = Settings.from_env({}, **settings)
        self.store = FakeStore(self.settings)
        self.board = Board()
        self.outcomes = FakeOutcomes()
        self.router = Router(self.board, self.settings, self.store)
        self.dispatcher = Dispatcher(
            self.store,
            self.store,
            self.outcomes,
            self.board,  # type: ignore[arg-type]
            self.router,
            self.settings,
        )

    def connect(self, worker_id: str, *task_types: int, credits: int, gpu: bool = False) -> Session:
        session = self.board.open(
            scheduler_pb2.WorkerHello(worker_id=worker_id, task_types=list(task_types or (TEXT,)), gpu=gpu)
        )
        session.cap_credits(100)
        self.board.add_credits(session, credits)
        return session


def received(session: Session) -> list[str]:
    """Ids of the tasks sent to a session's stream since last asked, in order."""
    ids: list[str] = []
    while not session.outbound.empty():
        message = session.outbound.get_nowait()
        if message is not None:
            ids += [a.task_id for a in message.batch.assignments]
    return ids


async def test_queued_tasks_go_to_a_worker_with_credits_and_spend_them() -> None:
    r = Replica()
    worker = r.connect("w1", credits=5)
    r.store.enqueue(A, entry("t1"), entry("t2"), entry("t3"))
    await r.dispatcher.dispatch_once()
    assert received(worker) == ["t1", "t2", "t3"]
    assert worker.credits == 2 and set(worker.held) == {"t1", "t2", "t3"}
    # leased in the store under lease number 1, the device left with nothing queued
    assert {t: e.attempt for t, (_, e) in r.store.leases.items()} == {"t1": 1, "t2": 1, "t3": 1}
    assert r.store.queued(A) == [] and r.dispatcher.dispatched == 3


async def test_a_hand_out_is_never_larger_than_the_credits_the_workers_have() -> None:
    r = Replica()
    worker = r.connect("w1", credits=2)
    r.store.enqueue(A, *(entry(f"t{i}") for i in range(5)))
    await r.dispatcher.dispatch_once()
    assert received(worker) == ["t0", "t1"] and worker.credits == 0
    assert [e.task_id for e in r.store.queued(A)] == ["t2", "t3", "t4"]


async def test_a_device_gives_at_most_one_batch_before_the_next_device_in_the_fair_order_has_its_turn() -> None:
    r = Replica(batch_size=2)
    worker = r.connect("w1", credits=6)
    r.store.enqueue(A, *(entry(f"a{i}", age_s=50) for i in range(5)))
    r.store.enqueue(B, *(entry(f"b{i}", age_s=10) for i in range(5)))
    claim = await r.dispatcher.dispatch_once()
    # one round: A (the longer wait) gives a batch, then B; A named again ends the round (one batch per device
    # per round: a device that becomes ready meanwhile competes in the next round, with the credits left)
    assert [(mac, [e.task_id for e in p.taken]) for mac, p in claim.devices] == [(A, ["a0", "a1"]), (B, ["b0", "b1"])]
    # and the worker gets them in one message, whatever the number of devices
    assert worker.outbound.qsize() == 1
    assert received(worker) == ["a0", "a1", "b0", "b1"] and worker.credits == 2
    # the next round goes on in the same order, as claims made one at a time would
    claim = await r.dispatcher.dispatch_once()
    assert [(mac, [e.task_id for e in p.taken]) for mac, p in claim.devices] == [(A, ["a2", "a3"])]


async def test_a_claim_round_takes_one_task_each_from_many_devices_in_one_call() -> None:
    r = Replica()
    worker = r.connect("w1", credits=50)
    for i in range(40):
        r.store.enqueue(f"AA:00:00:00:01:{i:02X}", entry(f"t{i}", age_s=100 - i))
    claim = await r.dispatcher.dispatch_once()
    assert len(claim.devices) == 40 and claim.taken == 40
    assert received(worker) == [f"t{i}" for i in range(40)]  # oldest wait first


async def test_the_device_that_waited_longest_is_served_first() -> None:
    r = Replica()
    worker = r.connect("w1", credits=1)
    r.store.enqueue(A, entry("a1", age_s=5))
    r.store.enqueue(B, entry("b1", age_s=50))
    await r.dispatcher.dispatch_once()
    assert received(worker) == ["b1"]


async def test_while_another_device_starves_a_batch_shrinks_to_the_minimum_and_the_device_served_sits_out() -> None:
    r = Replica(starvation_hint_s=1.0, min_batch_size=1, batch_size=10)
    worker = r.connect("w1", credits=20)
    assert worker.credits == 20
    r.store.enqueue(A, *(entry(f"a{i}", age_s=100) for i in range(5)))
    r.store.enqueue(B, *(entry(f"b{i}", age_s=50) for i in range(5)))
    claim = await r.dispatcher.dispatch_once()
    # the oldest device gives one task only, and the next choice goes to the other one; once nobody starves
    # (A was just served), batches are full again
    assert [(mac, [e.task_id for e in p.taken]) for mac, p in claim.devices] == [
        (A, ["a0"]),
        (B, ["b0", "b1", "b2", "b3", "b4"]),
    ]
    claim = await r.dispatcher.dispatch_once()
    assert [(mac, [e.task_id for e in p.taken]) for mac, p in claim.devices] == [(A, ["a1", "a2", "a3", "a4"])]
    assert worker.credits == 10


async def test_a_type_no_worker_takes_waits_on_its_own_while_the_devices_other_tasks_flow() -> None:
    r = Replica()
    worker = r.connect("text-only", TEXT, credits=5)
    r.store.enqueue(A, entry("o1", OCR, priority=HIGH), entry("t1"))
    await r.dispatcher.dispatch_once()  # stops at the OCR task: it goes to wait, the device is released
    await r.dispatcher.dispatch_once()
    assert received(worker) == ["t1"]
    assert [(mac, e.task_id, e.defers) for mac, e, _ in r.store.delayed] == [(A, "o1", 1)]
    [detail] = [d for ids, d in r.outcomes.notes if ids == ["o1"]]
    assert "its type only" in detail and "no GPU worker alive" in detail


async def test_a_type_whose_workers_are_only_full_keeps_its_place_at_the_head_of_the_queue() -> None:
    r = Replica()
    full = r.connect("text-full", TEXT, credits=0)
    gpu = r.connect("gpu", OCR, gpu=True, credits=1)
    r.store.enqueue(A, entry("t1", priority=HIGH), entry("o1", OCR))
    await r.dispatcher.dispatch_once()
    assert received(full) == [] and received(gpu) == []
    queued = r.store.queued(A)
    assert [e.task_id for e in queued] == ["t1", "o1"]
    # no penalty: its failures are not counted, nothing is delayed or dead-lettered (a new lease number next time)
    assert (queued[0].failures, queued[0].attempt) == (0, 1)
    assert not r.store.delayed and not r.store.dead_letters and not r.store.leases


async def test_expired_tasks_are_recorded_expired_and_not_handed_out() -> None:
    r = Replica()
    worker = r.connect("w1", credits=5)
    r.store.enqueue(A, entry("old", expires_in_s=-1), entry("fresh"))
    await r.dispatcher.dispatch_once()
    assert received(worker) == ["fresh"]
    assert [e.task_id for e in r.outcomes.expired_entries] == ["old"]


async def test_with_strategy_dead_letter_ocr_is_dead_lettered_at_once_while_gpu_workers_are_expected() -> None:
    r = Replica(no_gpu_strategy="dead_letter")
    cpu = r.connect("cpu", TEXT, OCR, credits=5)
    await r.store.mark_gpu_expected(60_000)  # a GPU worker was seen a moment ago, by some replica
    await r.router.observe([])
    r.store.enqueue(A, entry("o1", OCR))
    await r.dispatcher.dispatch_once()
    assert received(cpu) == []
    assert [(d["task_id"], d["error"]) for d in r.outcomes.dead] == [
        ("o1", "no GPU worker alive (strategy dead_letter)")
    ]
    assert [d["task_id"] for d in r.store.dead_letters] == ["o1"] and r.store.queued(A) == []


async def test_a_device_another_replica_is_serving_is_left_alone() -> None:
    r = Replica()
    worker = r.connect("w1", credits=5)
    r.store.enqueue(A, entry("a1"))
    r.store.enqueue(B, entry("b1"))
    r.store.devices[A].token = "another replica"  # still ready: its lock was taken a moment ago
    claim = await r.dispatcher.dispatch_once()
    # A's claim was refused (it is locked) and the round went on to B; named again, A ends the round
    assert [(mac, p.ready) for mac, p in claim.devices] == [(A, False), (B, True)]
    assert received(worker) == ["b1"] and [e.task_id for e in r.store.queued(A)] == ["a1"]


async def test_a_published_wake_up_wakes_the_dispatcher() -> None:
    r = Replica()
    listening = asyncio.create_task(r.dispatcher.listen_for_work())
    try:
        await asyncio.sleep(0)
        assert not r.dispatcher.wake.is_set()
        r.store.enqueue(A, entry("t1"))
        await asyncio.wait_for(r.dispatcher.wake.wait(), timeout=1)
    finally:
        listening.cancel()


async def test_the_loop_hands_out_work_as_credits_arrive_and_stops_when_asked() -> None:
    r = Replica()
    worker = r.connect("w1", credits=0)
    r.store.enqueue(A, *(entry(f"t{i}") for i in range(4)))
    running = asyncio.create_task(r.dispatcher.run())
    try:
        await asyncio.sleep(0.05)
        assert received(worker) == []  # no credit: nothing is popped
        r.board.add_credits(worker, 3)
        await _until(lambda: len(worker.held) == 3)
        assert received(worker) == ["t0", "t1", "t2"]
        r.board.add_credits(worker, 3)
        await _until(lambda: len(worker.held) == 4)
        assert received(worker) == ["t3"]
    finally:
        r.dispatcher.stop()
        await asyncio.wait_for(running, timeout=2)
    assert r.dispatcher.dispatched == 4


async def _until(condition: object, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
