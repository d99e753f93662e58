"""CostMeter: each device's tasks cost the worker pool their worker time over how many such tasks run at once."""

from __future__ import annotations

import pytest

from scheduler_svc.cost import MAX_WALL_MS, CostMeter
from sieve.settings import Settings
from sieve.v1 import types_pb2

TEXT, OCR = types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ocr_is_costed_and_text_counted_by_default() -> None:
    meter = CostMeter(Settings.from_env({}), Clock())
    charges = meter.charges([("A", OCR, 1000.0), ("B", OCR, 10.0), ("C", TEXT, 500.0)])
    # one task at a time as far as it knows: a task keeps the pool busy for its worker time
    assert charges == {"A": 1000.0, "B": 10.0}


def test_the_cost_is_divided_by_the_tasks_running_at_once() -> None:
    clock = Clock()
    meter = CostMeter(Settings.from_env({}), clock)
    # Given four OCR tasks at a time: 4 000 ms of worker time acked per second
    for _ in range(5):
        clock.now += 1.0
        meter.charges([("X", OCR, 1000.0)] * 4)
    assert meter.parallel[OCR] == pytest.approx(4.0, rel=0.05)
    # Then a 1 000 ms task keeps the pool busy for about 250 ms
    assert meter.charges([("A", OCR, 1000.0)])["A"] == pytest.approx(250.0, rel=0.06)


def test_a_device_with_several_tasks_in_one_ack_gets_their_mean() -> None:
    meter = CostMeter(Settings.from_env({}), Clock())
    assert meter.charges([("A", OCR, 300.0), ("A", OCR, 100.0)]) == {"A": 200.0}


def test_one_task_counts_at_most_the_bound_and_nothing_without_a_worker_time() -> None:
    meter = CostMeter(Settings.from_env({}), Clock())
    assert meter.charges([("A", OCR, 1e9)]) == {"A": MAX_WALL_MS}
    assert meter.charges([("A", OCR, 0.0)]) == {}


def test_counting_every_type_costs_nothing() -> None:
    meter = CostMeter(Settings.from_env({"SIEVE_FAIR_BY_COST_TYPES": ""}), Clock())
    assert meter.charges([("A", OCR, 1000.0), ("B", OCR, 1.0)]) == {}


def test_devices_sharing_the_pool_alike_are_charged_times_their_number() -> None:
    clock = Clock()
    meter = CostMeter(Settings.from_env({}), clock)
    # Given two devices with equal worker time each second, one task at a time, one 10x dearer per task
    for _ in range(8):
        clock.now += 1.0
        meter.charges([("L", OCR, 500.0)] + [("S", OCR, 50.0)] * 10)
    # Then the pool reads as shared by two, and each task is charged twice its wall time: a device that gets half
    # the pool is charged a second per second, its wait keeps pace with real time
    assert meter.sharing[OCR] == pytest.approx(2.0, rel=0.02)
    running = meter.parallel[OCR]
    charges = meter.charges([("L", OCR, 500.0), ("S", OCR, 50.0)])
    assert charges["L"] == pytest.approx(2 * 500.0 / running, rel=0.05)
    assert charges["L"] / charges["S"] == pytest.approx(10.0)


def test_a_device_with_the_pool_to_itself_is_charged_its_wall_time() -> None:
    clock = Clock()
    meter = CostMeter(Settings.from_env({}), clock)
    # Given one device using nearly all of the pool, another a trickle
    for _ in range(8):
        clock.now += 1.0
        meter.charges([("BIG", OCR, 950.0), ("TRICKLE", OCR, 10.0)])
    # Then the pool counts as about one device's: the trickle does not inflate the big one's charges
    assert 1.0 <= meter.sharing[OCR] < 1.1


def test_how_many_share_the_pool_looks_past_one_window() -> None:
    clock = Clock()
    meter = CostMeter(Settings.from_env({}), clock)
    # Given a dear device whose tasks end in every other window only, and a cheap one acked in the windows between
    for second in range(12):
        clock.now += 1.0
        meter.charges([("L", OCR, 2000.0)] if second % 2 else [("S", OCR, 100.0)] * 20)
    # Then the pool still reads as shared by about two (a single window would say one)
    assert 1.8 <= meter.sharing[OCR] <= 2.0
