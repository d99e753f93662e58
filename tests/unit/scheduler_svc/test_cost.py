"""CostMeter: devices are charged for what their tasks cost beyond the average of their type, within bounds."""

from __future__ import annotations

import pytest

from scheduler_svc.cost import MAX_CHARGE_MS, CostMeter
from sieve.settings import Settings
from sieve.v1 import types_pb2

TEXT, OCR = types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE


def test_ocr_is_charged_by_cost_and_text_by_count_by_default() -> None:
    meter = CostMeter(Settings.from_env({}))
    meter.average_ms[OCR] = 100.0
    charges = meter.charges([("A", OCR, 1000.0), ("B", OCR, 10.0), ("C", TEXT, 500.0)], ms_per_task=2.0)
    # A's task cost about 10 averages: charged about 9 hand-outs more; B's cost a tenth: nearly a hand-out back
    assert charges["A"] == pytest.approx(2.0 * (1000 / 100 - 1))
    assert -2.0 <= charges["B"] < -1.5
    assert "C" not in charges


def test_devices_with_a_tenfold_cost_difference_get_charges_that_even_out_their_worker_time() -> None:
    # Given two devices taking turns, L's tasks cost 10x S's: over many acks
    meter = CostMeter(Settings.from_env({}))
    total = {"L": 0.0, "S": 0.0}
    for _ in range(200):
        for device, cost in (("L", 400.0), ("S", 40.0)):
            total[device] += meter.charges([(device, OCR, cost)], ms_per_task=1.0).get(device, 0.0) + 1.0
    # Then each hand-out of L counts about ten times one of S (so each gets its turns in proportion)
    assert total["L"] / total["S"] == pytest.approx(10, rel=0.1)


def test_one_task_is_charged_at_most_the_bound_and_nothing_without_a_worker_time() -> None:
    meter = CostMeter(Settings.from_env({}))
    meter.average_ms[OCR] = 1.0
    assert meter.charges([("A", OCR, 1e9)], ms_per_task=5.0) == {"A": MAX_CHARGE_MS}
    assert meter.charges([("A", OCR, 0.0)], ms_per_task=5.0) == {}


def test_counting_every_type_charges_nothing() -> None:
    meter = CostMeter(Settings.from_env({"SIEVE_FAIR_BY_COST_TYPES": ""}))
    assert meter.charges([("A", OCR, 1000.0), ("B", OCR, 1.0)], ms_per_task=1.0) == {}
