"""Routing: which sessions may run a task type, best first, and what happens to a task when none can — against
the board's sessions and the in-memory fake of the replicas' shared GPU sightings (no Redis)."""

from __future__ import annotations

from datetime import UTC, datetime

from scheduler_svc.board import Board
from scheduler_svc.routing import Action, Router
from scheduler_svc.sessions import Session
from sieve.redis.worker_records import WorkerRecord
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, types_pb2
from tests.unit.scheduler_svc.fake_store import FakeStore

TEXT, OCR = types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE


def connect(board: Board, worker_id: str, *task_types: int, gpu: bool = False, credits: int = 1) -> Session:
    session = board.open(scheduler_pb2.WorkerHello(worker_id=worker_id, task_types=list(task_types), gpu=gpu))
    session.cap_credits(10)
    board.add_credits(session, credits)
    return session


def ids(sessions: list[Session]) -> list[str]:
    return [s.worker_id for s in sessions]


def router(board: Board, store: FakeStore | None = None, **settings: object) -> Router:
    return Router(board, Settings.from_env({}, **settings), store)


def gpu_worker_record() -> WorkerRecord:
    """A GPU worker that takes OCR, alive in the registry (connected to some replica)."""
    now = datetime.now(UTC)
    return WorkerRecord(
        worker_id="gpu-elsewhere",
        hostname="h",
        pid=1,
        task_types=(OCR,),
        gpu_available=True,
        gpu_count=1,
        gpu_names=("gpu",),
        gpu_memory_total_bytes=1,
        gpu_util_percent=0.0,
        gpu_memory_percent=0.0,
        cpu_count=1,
        cpu_percent=0.0,
        memory_total_bytes=1,
        memory_available_bytes=1,
        memory_percent=0.0,
        active_tasks=0,
        registered_at=now,
        last_heartbeat=now,
    )


def test_text_goes_to_every_worker_that_takes_it_the_one_with_most_credits_first() -> None:
    board = Board()
    connect(board, "few", TEXT, credits=1)
    connect(board, "many", TEXT, OCR, credits=5)
    connect(board, "ocr-only", OCR, credits=9)
    route = router(board).route(TEXT)
    assert ids(route.sessions) == ["many", "few"]
    assert route.otherwise is Action.WAIT and route.reason == ""


def test_a_type_no_live_worker_takes_is_deferred_saying_why() -> None:
    board = Board()
    connect(board, "ocr", OCR, gpu=True)
    route = router(board).route(TEXT)
    assert route.sessions == [] and route.otherwise is Action.DEFER
    assert route.reason == "no live worker takes TEXT"


def test_ocr_goes_to_gpu_workers_only_while_one_is_connected() -> None:
    board = Board()
    connect(board, "cpu", OCR, credits=5)
    connect(board, "gpu", OCR, gpu=True, credits=1)
    route = router(board).route(OCR)
    assert ids(route.sessions) == ["gpu"] and route.otherwise is Action.WAIT


async def test_ocr_waits_for_a_gpu_worker_alive_on_another_replica_instead_of_going_to_a_cpu() -> None:
    board = Board()
    connect(board, "cpu", OCR)
    routing = router(board, FakeStore(Settings.from_env({})))
    await routing.observe([gpu_worker_record()])
    route = routing.route(OCR)
    assert route.sessions == [] and route.otherwise is Action.WAIT


async def test_a_fleet_that_never_had_a_gpu_worker_runs_ocr_on_its_cpu_workers() -> None:
    board = Board()
    connect(board, "cpu", OCR)
    routing = router(board, FakeStore(Settings.from_env({})))
    await routing.observe([])
    route = routing.route(OCR)
    assert ids(route.sessions) == ["cpu"] and route.otherwise is Action.WAIT and route.reason == ""


async def test_while_gpu_workers_are_expected_the_strategy_decides_for_ocr() -> None:
    expected: dict[str, tuple[list[str], Action, str]] = {
        "defer": ([], Action.DEFER, "no GPU worker alive (strategy defer)"),
        "cpu": (["cpu"], Action.WAIT, "no GPU worker alive: routed to a CPU worker (strategy cpu)"),
        "dead_letter": ([], Action.DEAD_LETTER, "no GPU worker alive (strategy dead_letter)"),
    }
    for strategy, (sessions, otherwise, reason) in expected.items():
        board = Board()
        store = FakeStore(Settings.from_env({}))
        await store.mark_gpu_expected(60_000)  # a replica saw a GPU worker a moment ago; it is gone now
        connect(board, "cpu", OCR)
        routing = router(board, store, no_gpu_strategy=strategy)
        await routing.observe([])
        route = routing.route(OCR)
        assert (ids(route.sessions), route.otherwise, route.reason) == (sessions, otherwise, reason), strategy


async def test_a_gpu_worker_seen_by_one_replica_makes_gpu_workers_expected_at_every_replica() -> None:
    store = FakeStore(Settings.from_env({}))
    here, there = Board(), Board()
    connect(here, "gpu", OCR, gpu=True)
    connect(there, "cpu", OCR)
    seeing, other = router(here, store), router(there, store)
    await seeing.observe([])
    await other.observe([])
    assert seeing.gpu_expected and other.gpu_expected
    assert other.route(OCR).otherwise is Action.DEFER  # strategy defer: the CPU worker does not get it


async def test_gpu_workers_stop_being_expected_once_none_was_seen_for_the_window() -> None:
    store = FakeStore(Settings.from_env({}))
    board = Board()
    connect(board, "cpu", OCR)
    routing = router(board, store, gpu_expected_s=600.0)
    await routing.observe([gpu_worker_record()])
    await routing.observe([])
    assert routing.gpu_expected
    store.now += 601_000
    await routing.observe([])
    assert not routing.gpu_expected
    assert ids(routing.route(OCR).sessions) == ["cpu"]


def test_popping_is_allowed_only_for_types_some_eligible_worker_has_a_credit_for() -> None:
    board = Board()
    connect(board, "text-full", TEXT, credits=0)
    connect(board, "gpu", OCR, gpu=True, credits=2)
    assert router(board).allowed_types() == [OCR]
