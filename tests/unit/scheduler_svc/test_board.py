"""The board of one replica's worker sessions: credits within each worker's cap, placing popped tasks on the
sessions routing names (one credit each), lease tokens only the holding stream can settle, what a closed session
hands back. No Redis: the board keeps its state in memory."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from scheduler_svc.board import Board, Placement
from scheduler_svc.routing import Action, Route
from scheduler_svc.sessions import Handed, Session
from sieve.db.tasks import HandOut
from sieve.redis.entry import Entry
from sieve.v1 import scheduler_pb2
from tests.unit.scheduler_svc.fake_store import entry

TEXT, OCR = 1, 2
MAC, OTHER_MAC = "AA:00:00:00:00:01", "AA:00:00:00:00:02"


class RecordedHandOuts:
    """Stands in for the LifecycleWriter: keeps the ASSIGNED records it is given."""

    def __init__(self) -> None:
        self.records: list[HandOut] = []

    def assigned(self, items: list[HandOut]) -> None:
        self.records += items


def connect(
    board: Board, worker_id: str, *task_types: int, credits: int = 0, cap: int = 10, gpu: bool = False
) -> Session:
    session = board.open(
        scheduler_pb2.WorkerHello(worker_id=worker_id, task_types=list(task_types or (TEXT,)), gpu=gpu)
    )
    session.cap_credits(cap)
    board.add_credits(session, credits)
    return session


def popped(task_id: str, task_type: int = TEXT, **kw: object) -> Entry:
    """An entry as a pop hands it over: leased, its attempt (the lease number) raised to 1."""
    return entry(task_id, task_type, **kw).with_attempt(1)  # type: ignore[arg-type]


def to_takers(board: Board) -> Callable[[int], Route]:
    """Routes every type to the sessions that take it, most credits first; nobody: the task waits."""
    return lambda task_type: Route(sorted(board.takers(task_type), key=lambda s: -s.credits), Action.WAIT)


def only(*sessions: Session, otherwise: Action = Action.WAIT, reason: str = "") -> Callable[[int], Route]:
    return lambda task_type: Route(list(sessions), otherwise, reason)


def placed_ids(placement: Placement) -> dict[str, list[str]]:
    return {s.worker_id: [e.task_id for e in entries] for s, entries in placement.placed.items()}


def test_a_worker_is_given_credits_up_to_its_registered_concurrency_counting_what_it_holds() -> None:
    board = Board()
    session = connect(board, "w1", cap=3)
    assert board.add_credits(session, 2) == 2
    board.place(MAC, [popped("t1")], to_takers(board))
    # one held + one unused credit: room for one more, whatever it asks for
    assert board.add_credits(session, 5) == 1
    assert (session.credits, len(session.held)) == (2, 1)


def test_a_worker_that_has_not_registered_takes_no_credit() -> None:
    board = Board()
    session = connect(board, "w1", cap=0)
    assert board.add_credits(session, 4) == 0 and board.credits == 0


def test_placing_a_task_spends_one_credit_of_the_worker_routing_names_first() -> None:
    board = Board()
    roomy = connect(board, "roomy", credits=3)
    tight = connect(board, "tight", credits=1)
    placement = board.place(MAC, [popped("t1"), popped("t2")], to_takers(board))
    # the one with the most room is named first for the device's type, and takes both
    assert placed_ids(placement) == {"roomy": ["t1", "t2"]}
    assert (roomy.credits, tight.credits) == (1, 1)
    assert roomy.held == {"t1": (MAC, 1), "t2": (MAC, 1)}
    assert set(roomy.tokens) == {"t1", "t2"} and not tight.held


def test_when_the_first_worker_runs_out_of_credits_the_next_one_takes_the_rest() -> None:
    board = Board()
    first = connect(board, "first", credits=1)
    second = connect(board, "second", credits=5)
    placement = board.place(MAC, [popped("t1"), popped("t2"), popped("t3")], only(first, second))
    assert placed_ids(placement) == {"first": ["t1"], "second": ["t2", "t3"]}
    assert (first.credits, second.credits) == (0, 3)


def test_tasks_nobody_has_a_credit_for_come_back_unplaced_under_their_routes_action() -> None:
    board = Board()
    full = connect(board, "full", TEXT, credits=0)

    def route(task_type: int) -> Route:
        return Route([full], Action.WAIT) if task_type == TEXT else Route([], Action.DEFER, "nobody takes OCR")

    placement = board.place(MAC, [popped("t1"), popped("o1", OCR)], route)
    assert placement.placed == {}
    assert {action: [e.task_id for e in entries] for action, entries in placement.unplaced.items()} == {
        "wait": ["t1"],
        "defer": ["o1"],
    }
    assert not full.held


def test_a_routing_reason_is_noted_for_the_tasks_it_placed() -> None:
    board = Board()
    cpu = connect(board, "cpu", OCR, credits=2)
    placement = board.place(MAC, [popped("o1", OCR)], only(cpu, reason="routed to a CPU worker"))
    assert placement.notes == {"routed to a CPU worker": ["o1"]}


def test_a_closed_session_takes_no_task_even_with_credits_left() -> None:
    board = Board()
    gone = connect(board, "gone", credits=5)
    board.close(gone)
    placement = board.place(MAC, [popped("t1")], only(gone))
    assert placement.placed == {} and [e.task_id for e in placement.unplaced["wait"]] == ["t1"]


def test_only_the_holding_stream_with_the_exact_token_holds_a_task() -> None:
    board = Board()
    holder = connect(board, "w1", credits=1)
    other = connect(board, "w2", credits=1)
    board.place(MAC, [popped("t1")], only(holder))
    token = holder.tokens["t1"]
    assert board.holds(holder, "t1", token)
    assert not board.holds(holder, "t1", token[:-1] + ("0" if token[-1] != "0" else "1"))
    assert not board.holds(other, "t1", token)


def test_send_puts_one_batch_on_the_stream_and_records_each_hand_out_assigned() -> None:
    handed = RecordedHandOuts()
    board = Board(lifecycle=handed)  # type: ignore[arg-type]
    session = connect(board, "w1", credits=2)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    placement = board.place(MAC, [popped(first), popped(second, failures=1)], to_takers(board))
    board.send(session, MAC, placement.placed[session])
    message = session.outbound.get_nowait()
    assert message is not None
    # one batch; the attempt a worker sees counts failures (the lease number is in the token)
    assert [(a.task_id, a.device_id, a.attempt, a.lease_token) for a in message.batch.assignments] == [
        (first, MAC, 1, session.tokens[first]),
        (second, MAC, 2, session.tokens[second]),
    ]
    assert [(str(h.task_id), h.lease, h.attempt, h.worker_id) for h in handed.records] == [
        (first, 1, 1, "w1"),
        (second, 1, 2, "w1"),
    ]


def test_closing_a_session_hands_back_what_it_held_by_device_and_ends_its_stream() -> None:
    board = Board()
    session = connect(board, "w1", credits=3)
    board.place(MAC, [popped("t1"), popped("t2")], to_takers(board))
    board.place(OTHER_MAC, [popped("t3")], to_takers(board))
    held = board.close(session)
    assert held == {MAC: [("t1", 1), ("t2", 1)], OTHER_MAC: [("t3", 1)]}
    assert session.closed and not session.held and not session.tokens and session not in board.sessions
    assert session.outbound.get_nowait() is None


def test_hand_outs_held_past_their_types_timeout_and_grace_are_listed() -> None:
    board = Board()
    session = connect(board, "w1", TEXT, OCR, credits=2)
    board.place(MAC, [popped("t1"), popped("o1", OCR)], to_takers(board))
    later = time.monotonic() + 65
    limits = {"TEXT": 60.0, "OCR_IMAGE": 120.0}
    assert board.timed_out(limits.__getitem__, grace_s=2.0, now=later) == [(session, "t1")]
    assert board.timed_out(limits.__getitem__, grace_s=10.0, now=later) == []


def test_only_the_tasks_of_workers_heard_from_lately_are_kept_alive() -> None:
    board = Board()
    talking = connect(board, "talking", credits=1)
    silent = connect(board, "silent", credits=1)
    board.place(MAC, [popped("t1")], only(talking))
    board.place(MAC, [popped("t2")], only(silent))
    silent.last_seen -= 60
    talking.heard_from()
    assert board.live_held_task_ids(within_s=30) == ["t1"]


def test_an_adopted_lease_is_held_under_its_own_token_without_spending_a_credit() -> None:
    board = Board()
    session = connect(board, "w1", credits=1)
    session.claim("t9", "7.signature", assigned_at=time.monotonic())
    board.adopt(session, "t9", MAC, 7, "7.signature", Handed(time.monotonic(), TEXT))
    assert board.holds(session, "t9", "7.signature") and session.held["t9"] == (MAC, 7)
    assert session.credits == 1 and "t9" not in session.claims
    assert board.holder("t9") is session


async def test_waiting_for_every_ack_returns_once_the_last_held_task_is_settled() -> None:
    board = Board()
    session = connect(board, "w1", credits=2)
    board.place(MAC, [popped("t1"), popped("t2")], to_takers(board))
    waiting = asyncio.create_task(board.all_acked())
    board.forget(session, ["t1"])
    await asyncio.sleep(0)
    assert not waiting.done()
    board.forget(session, ["t2"])
    await asyncio.wait_for(waiting, timeout=1)
